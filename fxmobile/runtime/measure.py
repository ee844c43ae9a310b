"""Measure, on a real reference runtime, the figures ``install.RUNTIMES`` records.

- its bytecode range, as its lite interpreter states it when refusing a file whose bytecode
  version is out of range (a real file with the version number in ``bytecode.pkl`` set to 99;
  the check runs before anything else is read);
- which bytecode versions real files load in and run with the same outputs: one fxmobile file
  backported here to every version torch here writes;
- its maximum operator version (``torch._C._get_max_operator_version()`` there).

``python -m fxmobile.runtime.measure`` prints them for every installed runtime next to the
recorded ones; ``tests/test_runtime_compat.py`` fails when they differ.
"""

from __future__ import annotations

import io
import re
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.jit.mobile

from fxmobile.options import DEFAULT_TOLERANCE
from fxmobile.runtime.compat import LOWEST_BACKPORT, backport_to_bytecode, bytecode_version
from fxmobile.runtime.errors import RuntimeLoadError
from fxmobile.runtime.install import RUNTIMES
from fxmobile.runtime.process import RuntimeProcess, installed
from fxmobile.runtime.samples import sample_file, with_bytecode_number
from fxmobile.verify import compare_outputs

_RANGE = re.compile(r"must be between (\d+) and (\d+)")
_OUT_OF_RANGE = 99  # a bytecode version no runtime reads


@dataclass(frozen=True)
class Measurement:
    """What one runtime said about bytecode and operator versions."""

    runtime: str
    bytecode_range: tuple[int, int]
    loaded_bytecode: tuple[int, ...]
    refused_bytecode: dict[int, str]  # version -> the runtime's message
    max_operator_version: int | None


def measure(runtime: RuntimeProcess, data: bytes, inputs: tuple[Any, ...]) -> Measurement:
    """The figures for the runtime ``runtime`` runs, using the lite file ``data``."""
    try:
        runtime.load(with_bytecode_number(data, _OUT_OF_RANGE))
    except RuntimeLoadError as exc:
        found = _RANGE.search(exc.runtime_message)
        if found is None:
            raise RuntimeError(f"unexpected refusal: {exc.runtime_message}") from exc
        declared = (int(found.group(1)), int(found.group(2)))
    else:
        raise RuntimeError(f"torch {runtime.version} loaded bytecode {_OUT_OF_RANGE}")
    reference = torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(data))(*inputs)
    loaded, refused = [], {}
    for version in range(bytecode_version(data), LOWEST_BACKPORT - 1, -1):
        try:
            loaded_file = runtime.load(backport_to_bytecode(data, version))
        except RuntimeLoadError as exc:
            refused[version] = exc.runtime_message
            continue
        checks = compare_outputs(reference, loaded_file.run(*inputs), DEFAULT_TOLERANCE)
        loaded_file.close()
        if all(check.passed for check in checks):
            loaded.append(version)
        else:
            refused[version] = "loaded, but its outputs differ from this process's"
    return Measurement(
        runtime.version,
        declared,
        tuple(sorted(loaded)),
        refused,
        runtime.info.max_operator_version,
    )


def main() -> int:
    """Print the measured figures of every installed runtime next to the recorded ones."""
    data, inputs = sample_file()
    for version, spec in RUNTIMES.items():
        if not installed(version):
            print(f"torch {version}: not installed (make runtimes)")
            continue
        with RuntimeProcess(version) as runtime:
            found = measure(runtime, data, inputs)
        print(f"torch {version}:")
        print(f"  bytecode range      {found.bytecode_range} (recorded {spec.bytecode_range})")
        print(f"  real files loaded   {found.loaded_bytecode} (recorded {spec.loaded_bytecode})")
        for refused, message in found.refused_bytecode.items():
            print(f"  bytecode {refused} refused: {message}")
        print(
            f"  max operator version {found.max_operator_version} "
            f"(recorded {spec.max_operator_version})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
