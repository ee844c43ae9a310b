"""An optimized file on the real runtimes against eager and against upstream's own optimizer.

What ``fxmobile optimize ... --runtime V [--latency]`` shows: the saved file checked on each
runtime against eager's outputs, upstream's ``optimize_for_mobile`` output made in that runtime
from the same weights (the model scripted here, ``torch.jit.save``-d, loaded and optimized
there) checked the same way, and with ``latency`` all of them timed interleaved with eager in
this process (``compare_latency``). A model that does not script gets no upstream candidate, and
a note saying why; nothing else is left out silently.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fxmobile.report.records import OutputCheck
from fxmobile.runtime.check import RuntimeCheck, check_on_runtimes, checks_table
from fxmobile.runtime.compat import read_bytes
from fxmobile.runtime.errors import RuntimeCallError, RuntimeLoadError
from fxmobile.runtime.latency import Candidate, Here, Latency, OnRuntime, compare_latency
from fxmobile.runtime.latency import latency_table as render_latency
from fxmobile.runtime.process import LoadedFile, RuntimeProcess, require_installed
from fxmobile.verify import compare_outputs, run_model


@dataclass
class AgainstUpstream:
    """The file's checks per runtime, upstream's per runtime, latency, and notes."""

    checks: list[RuntimeCheck]
    upstream_checks: dict[str, list[OutputCheck]] = field(default_factory=dict)
    latency: dict[str, Latency] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """The fxmobile file loads, runs and matches eager on every runtime."""
        return all(check.passed for check in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "checks": [c.to_dict() for c in self.checks],
            "upstream_checks": {
                v: [c.to_dict() for c in checks] for v, checks in self.upstream_checks.items()
            },
            "latency": None
            if self.latency is None
            else {name: t.to_dict() for name, t in self.latency.items()},
            "notes": self.notes,
        }

    def render(self, tablefmt: str = "simple") -> str:
        parts = [
            "the file on the reference runtimes, against eager:",
            checks_table(self.checks, tablefmt),
        ]
        for version, checks in self.upstream_checks.items():
            worst = max((c.relative_error for c in checks), default=0.0)
            verdict = "ok" if all(c.passed for c in checks) else "MISMATCH"
            parts.append(
                f"upstream optimize_for_mobile on torch {version} against eager: relative "
                f"error {worst:.3g} ({verdict})"
            )
        if self.latency is not None:
            parts.append(render_latency(self.latency, tablefmt=tablefmt))
        parts += self.notes
        return "\n\n".join(parts)


def against_upstream(
    model: nn.Module,
    file: Path | str | bytes,
    inputs: Sequence[Any],
    versions: Sequence[str],
    latency: bool = False,
    rounds: int = 20,
    calls: int = 3,
    threads: int = 2,
    tolerance: float | None = None,
    here: Mapping[str, Candidate] | None = None,
    processes: Mapping[str, RuntimeProcess] | None = None,
    min_time: float = 0.0,
) -> AgainstUpstream:
    """``model`` is the eager model (or a ScriptModule) the file was made from, in eval mode.

    ``here`` adds candidates of this process to the latency run (eager is always one, first).
    ``processes`` are running runtimes to use (others are started, and stopped at the end);
    ``min_time`` gives fast models more rounds (``compare_latency``).
    Every runtime must be installed (checked before anything starts).
    """
    for version in versions:
        require_installed(version)
    data = read_bytes(file)
    inputs = tuple(inputs)
    reference = run_model(model, inputs)
    with contextlib.ExitStack() as stack:
        running = dict(processes or {})
        for version in versions:
            if version not in running or running[version]._closed:
                running[version] = stack.enter_context(RuntimeProcess(version, threads=threads))
        found = AgainstUpstream(
            check_on_runtimes(data, inputs, versions, reference, tolerance, processes=running)
        )
        upstream = _upstream_files(model, {v: running[v] for v in versions}, found, stack)
        for version, loaded in upstream.items():
            try:
                outputs = loaded.run(*inputs)
            except RuntimeCallError as exc:
                found.notes.append(
                    f"upstream optimize_for_mobile's file fails on torch {version}: "
                    f"{exc.runtime_message}"
                )
                continue
            found.upstream_checks[version] = compare_outputs(reference, outputs, tolerance)
        if latency:
            candidates: dict[str, Candidate] = {"eager": Here(model, inputs, "ATen (eager)")}
            candidates.update(here or {})
            for check in found.checks:
                if check.passed:
                    ours = stack.enter_context(_closing(running[check.runtime].load(data)))
                    candidates[f"fxmobile file on {check.runtime}"] = OnRuntime(ours, inputs)
            for version in found.upstream_checks:
                candidates[f"upstream file on {version}"] = OnRuntime(upstream[version], inputs)
            found.latency = compare_latency(
                candidates, rounds=rounds, calls=calls, min_time=min_time
            )
    return found


def _upstream_files(
    model: nn.Module,
    processes: Mapping[str, RuntimeProcess],
    found: AgainstUpstream,
    stack: contextlib.ExitStack,
) -> dict[str, LoadedFile]:
    """Upstream's optimize_for_mobile of ``model`` in each runtime, loaded there."""
    try:
        scripted = model if isinstance(model, torch.jit.ScriptModule) else torch.jit.script(model)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        found.notes.append(f"no upstream candidate: the model does not script ({first})")
        return {}
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fxmobile-upstream-")))
    path = folder / "scripted.pt"
    torch.jit.save(scripted, str(path))
    loaded = {}
    for version, process in processes.items():
        try:
            loaded[version] = stack.enter_context(_closing(process.upstream_optimized(path)))
        except RuntimeLoadError as exc:
            found.notes.append(
                f"no upstream candidate on torch {version}: its optimize_for_mobile or loader "
                f"failed ({exc.runtime_message})"
            )
    return loaded


@contextlib.contextmanager
def _closing(loaded: LoadedFile) -> Any:
    try:
        yield loaded
    finally:
        if not loaded.runtime._closed:
            loaded.close()
