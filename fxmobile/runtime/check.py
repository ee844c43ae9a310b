"""Run one saved file in reference runtimes and compare their outputs with a reference.

``check_on_runtimes`` is what ``fxmobile check`` prints; ``fxmobile optimize --runtime`` can
call it with eager's outputs as the reference instead of this process's run of the file.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.jit.mobile
from tabulate import tabulate

from fxmobile.backends.library import OpFamily, Provider, ensure_registered, registration_status
from fxmobile.errors import InvalidValueError
from fxmobile.report.records import OutputCheck
from fxmobile.runtime.compat import bytecode_version, read_bytes
from fxmobile.runtime.errors import RuntimeCallError, RuntimeLoadError
from fxmobile.runtime.install import RUNTIMES
from fxmobile.runtime.process import RuntimeProcess, require_installed, runtime_spec
from fxmobile.runtime.server import runtime_message
from fxmobile.verify import compare_outputs


@dataclass(frozen=True)
class RuntimeCheck:
    """The file in one reference runtime against the reference outputs."""

    runtime: str  # "1.13.1"
    kernels: str
    loads: bool
    bytecode_version: int
    bytecode_range: tuple[int, int]  # recorded, measured on that runtime
    checks: list[OutputCheck]  # empty when it did not load or run
    error: str | None  # the runtime's own message when it did not load or run

    @property
    def bytecode_accepted(self) -> bool:
        low, high = self.bytecode_range
        return low <= self.bytecode_version <= high

    @property
    def max_abs_error(self) -> float | None:
        return max((c.max_abs_error for c in self.checks), default=None)

    @property
    def relative_error(self) -> float | None:
        return max((c.relative_error for c in self.checks), default=None)

    @property
    def passed(self) -> bool:
        return self.loads and self.error is None and all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "kernels": self.kernels,
            "loads": self.loads,
            "bytecode_version": self.bytecode_version,
            "bytecode_range": list(self.bytecode_range),
            "bytecode_accepted": self.bytecode_accepted,
            "max_abs_error": self.max_abs_error,
            "relative_error": self.relative_error,
            "passed": self.passed,
            "error": self.error,
            "outputs": [c.to_dict() for c in self.checks],
        }


def runtime_versions(choice: str) -> list[str]:
    """``"all"`` -> every reference runtime, oldest first; a version -> itself (checked)."""
    if choice == "all":
        return list(RUNTIMES)
    return [runtime_spec(choice).version]


def here_kernels() -> str:
    """Which kernels the prepacked:: ops run on in this process."""
    provider = registration_status()[OpFamily.XNNPACK]
    if provider is Provider.NATIVE:
        return "XNNPACK"
    return "fxmobile._C (desktop kernels)"


def run_here(file: Path | str | bytes, inputs: Sequence[Any], method: str = "forward") -> Any:
    """The file's outputs in this process's lite interpreter, with fxmobile's operator library."""
    for family in OpFamily:
        ensure_registered(family)
    data = read_bytes(file)
    module = torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(data))
    with torch.no_grad():
        return module.run_method(method, *inputs)


def bundled_inputs(file: Path | str | bytes) -> list[tuple[Any, ...]]:
    """The file's bundled inputs (``torch.utils.bundled_inputs``), run here; [] if none."""
    for family in OpFamily:
        ensure_registered(family)
    module = torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(read_bytes(file)))
    if not module.find_method("get_all_bundled_inputs"):
        return []
    return [tuple(inputs) for inputs in module.run_method("get_all_bundled_inputs")]


def check_on_runtimes(
    file: Path | str | bytes,
    inputs: Sequence[Any],
    versions: Sequence[str],
    reference: Any = None,
    tolerance: float | None = None,
    threads: int = 2,
    processes: Mapping[str, RuntimeProcess] | None = None,
) -> list[RuntimeCheck]:
    """Load and run the file in each runtime of ``versions`` on ``inputs``; compare with
    ``reference`` (default: the file run here). ``processes`` are reused where given; others
    are started, and stopped at the end. Every runtime must be installed (checked first)."""
    data = read_bytes(file)
    version = bytecode_version(data)
    if reference is None:
        reference = _reference_here(data, inputs)
    for name in versions:
        require_installed(name)
    found = []
    with contextlib.ExitStack() as stack:
        for name in versions:
            process = (processes or {}).get(name) or stack.enter_context(
                RuntimeProcess(name, threads=threads)
            )
            found.append(_check_one(process, data, version, inputs, reference, tolerance))
    return found


def _reference_here(data: bytes, inputs: Sequence[Any]) -> Any:
    for family in OpFamily:
        ensure_registered(family)
    try:
        module = torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(data))
    except RuntimeError as exc:
        raise InvalidValueError(
            f"this process's lite interpreter cannot load the file ({runtime_message(exc)}), "
            f"so there is nothing to compare the runtimes with"
        ) from None
    try:
        with torch.no_grad():
            return module(*inputs)
    except RuntimeError as exc:
        raise InvalidValueError(
            f"the file does not run here on these inputs ({runtime_message(exc)}); pass inputs "
            f"of the shapes it takes"
        ) from None


def _check_one(
    process: RuntimeProcess,
    data: bytes,
    version: int,
    inputs: Sequence[Any],
    reference: Any,
    tolerance: float | None,
) -> RuntimeCheck:
    spec = RUNTIMES[process.version]

    def result(loads: bool, checks: list[OutputCheck], error: str | None) -> RuntimeCheck:
        return RuntimeCheck(
            process.version,
            process.info.kernels,
            loads,
            version,
            spec.bytecode_range,
            checks,
            error,
        )

    try:
        loaded = process.load(data)
    except RuntimeLoadError as exc:
        return result(False, [], exc.runtime_message)
    with _closing(loaded):
        try:
            outputs = loaded.run(*inputs)
        except RuntimeCallError as exc:
            return result(True, [], f"loads, but running it failed: {exc.runtime_message}")
    try:
        checks = compare_outputs(reference, outputs, tolerance)
    except InvalidValueError as exc:
        return result(True, [], str(exc))
    return result(True, checks, None)


@contextlib.contextmanager
def _closing(loaded: Any) -> Iterator[None]:
    try:
        yield
    finally:
        loaded.close()


def checks_table(found: Sequence[RuntimeCheck], tablefmt: str = "simple") -> str:
    """One row per runtime (the kernels it ran on, whether it loads, whether its recorded
    bytecode range takes the file, the worst error, the verdict), then each runtime's own
    message where it refused or failed."""
    rows = [_row(check) for check in found]
    version = found[0].bytecode_version if found else "?"
    headers = [
        "runtime",
        "kernels",
        "loads",
        f"bytecode {version} accepted",
        "max abs err",
        "relative",
        "check",
    ]
    parts = [tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True)]
    parts += [f"torch {check.runtime}: {check.error}" for check in found if check.error]
    return "\n\n".join(parts)


def _row(check: RuntimeCheck) -> list[str]:
    low, high = check.bytecode_range
    accepted = f"{'yes' if check.bytecode_accepted else 'no'} ({low}-{high})"
    if check.passed:
        verdict = "ok"
    elif not check.loads:
        verdict = "LOAD FAILED"
    elif not check.checks:
        verdict = "RUN FAILED"
    else:
        verdict = "MISMATCH"
    return [
        f"torch {check.runtime}",
        check.kernels,
        "yes" if check.loads else "no",
        accepted,
        "-" if check.max_abs_error is None else f"{check.max_abs_error:.3g}",
        "-" if check.relative_error is None else f"{check.relative_error:.3g}",
        verdict,
    ]
