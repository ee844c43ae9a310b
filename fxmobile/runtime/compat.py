"""Which runtimes load a lite-interpreter file, read with torch's mobile compatibility API.

A runtime loads a file when three things agree (torch's own ``is_compatible`` checks these):

- bytecode version (``torch.jit.mobile._get_model_bytecode_version``; 8 for what torch 2.15
  writes) within the runtime's bytecode range. A newer file can be backported
  (``torch.jit.mobile._backport_for_mobile``); torch 2.15 writes versions 4 to 8.
- operator version: the archive's ``version`` record, the newest operator semantics the file
  relies on. torch raises it when the file uses an operator whose meaning changed (its entry in
  ``torch._C._get_operator_version_map()``: ``aten::div`` at 4, ``aten::gelu`` at 10...); a
  runtime whose ``_get_max_operator_version()`` is lower would run the old meaning, and no
  backport changes what an operator computes, so that is a refusal naming the operator.
- operators: each one the file calls (``torch.jit.mobile._get_model_ops_and_info``) exists in
  the runtime with at least as many schema arguments. Only a running runtime can say
  (``RuntimeProcess.operators()``); without it this check is left out and said so.

The reference runtimes' ranges are measured on them (``fxmobile.runtime.measure``) and
recorded in ``install.RUNTIMES``, ordered oldest first.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.jit.mobile

from fxmobile.backends.library import OpFamily, ensure_registered
from fxmobile.errors import InvalidValueError
from fxmobile.runtime.errors import IncompatibleRuntimeError
from fxmobile.runtime.install import RUNTIMES, RuntimeSpec
from fxmobile.runtime.process import runtime_spec

# _backport_for_mobile's floor: torch 2.15 writes no bytecode older than this.
LOWEST_BACKPORT = 4


@dataclass(frozen=True)
class VersionedOperator:
    """An operator of the file whose meaning changed at ``version`` (torch's upgrader map)."""

    name: str  # "aten::gelu"
    version: int  # the operator version its current meaning starts at


@dataclass(frozen=True)
class Verdict:
    """Whether one runtime loads the file."""

    runtime: str
    loads: bool  # as the file is
    after_backport: bool  # once backport_for(runtime) has rewritten it (True when loads)
    reason: str


@dataclass(frozen=True)
class FileCompatibility:
    """What a file needs from a runtime, and whether each reference runtime has it."""

    bytecode_version: int
    operator_version: int
    operators: dict[str, int]  # operator -> number of schema arguments the file passes
    versioned_operators: list[VersionedOperator]
    verdicts: dict[str, Verdict]  # per reference runtime, oldest first
    operators_checked: list[str] = field(default_factory=list)  # runtimes asked for their ops

    @property
    def oldest_runtime(self) -> str | None:
        """The oldest reference runtime that loads the file as it is."""
        return next((v.runtime for v in self.verdicts.values() if v.loads), None)

    @property
    def oldest_after_backport(self) -> str | None:
        """The oldest reference runtime that loads it once ``backport_for`` has run."""
        return next((v.runtime for v in self.verdicts.values() if v.after_backport), None)

    def to_dict(self) -> dict[str, Any]:
        oldest = self.oldest_runtime
        return {
            **asdict(self),
            "oldest_runtime": oldest,
            "oldest_role": RUNTIMES[oldest].role if oldest else None,
            "oldest_after_backport": self.oldest_after_backport,
        }


def read_bytes(file: Path | str | bytes) -> bytes:
    """The bytes of ``file`` (a path or the bytes themselves); ``InvalidValueError`` if absent."""
    if isinstance(file, bytes):
        return file
    path = Path(file)
    if not path.is_file():
        raise InvalidValueError(f"{path}: no such file")
    return path.read_bytes()


def bytecode_version(data: bytes) -> int:
    """The lite-interpreter bytecode version of a saved file (its ``bytecode.pkl``)."""
    _require_bytecode(data)
    return int(torch.jit.mobile._get_model_bytecode_version(io.BytesIO(data)))


def operator_version(data: bytes) -> int:
    """The archive's ``version`` record: the operator version the file was written for."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        for suffix in ("/.data/version", "/version"):
            found = [n for n in names if n.endswith(suffix) and n.count("/") == suffix.count("/")]
            if found:
                return int(archive.read(found[0]).decode().strip())
    raise InvalidValueError("the archive has no version record; is it a TorchScript file?")


def versioned_operators(operators: Mapping[str, int]) -> list[VersionedOperator]:
    """The operators in ``operators`` whose meaning torch has changed, newest change first."""
    changes = torch._C._get_operator_version_map()
    found = [
        VersionedOperator(name, max(entry.bumped_at_version for entry in changes[name]))
        for name in operators
        if name in changes
    ]
    return sorted(found, key=lambda op: (-op.version, op.name))


def _ops_and_info(data: bytes) -> dict[str, Any]:
    """``torch.jit.mobile._get_model_ops_and_info`` of a file's bytes. That wrapper, given a
    buffer, hands its bytes to the path overload ("open file failed ... file path: PK"), so
    this calls the buffer binding itself."""
    # the binding takes bytes (as the wrappers for the other buffer readers pass); its stub says IO
    return dict(torch._C._get_model_ops_and_info_from_buffer(data))  # type: ignore[arg-type]


def file_compatibility(
    file: Path | str | bytes, runtime_operators: Mapping[str, Mapping[str, int]] | None = None
) -> FileCompatibility:
    """The file's versions and, per reference runtime, whether it loads there.

    ``runtime_operators`` (runtime version -> ``RuntimeProcess.operators()``) adds the check
    that every operator exists there; without it that check is left out.
    """
    data = read_bytes(file)
    version = bytecode_version(data)
    operators = {name: int(info.num_schema_args) for name, info in _ops_and_info(data).items()}
    versioned = versioned_operators(operators)
    op_version = operator_version(data)
    known = runtime_operators or {}
    verdicts = {
        spec.version: verdict_for(
            spec, version, op_version, versioned, operators, known.get(spec.version)
        )
        for spec in RUNTIMES.values()
    }
    return FileCompatibility(
        version, op_version, operators, versioned, verdicts, sorted(known, key=list(RUNTIMES).index)
    )


def verdict_for(
    spec: RuntimeSpec,
    bytecode: int,
    op_version: int,
    versioned: list[VersionedOperator],
    operators: Mapping[str, int],
    runtime_operators: Mapping[str, int] | None,
) -> Verdict:
    """Whether a runtime with ``spec``'s recorded ranges loads a file with these versions."""
    name = f"torch {spec.version}"
    newer = [op for op in versioned if op.version > spec.max_operator_version]
    if newer:
        listed = ", ".join(f"{op.name} (operator version {op.version})" for op in newer)
        return Verdict(
            spec.version,
            False,
            False,
            f"{listed} changed meaning after {name}, which knows operator versions up to "
            f"{spec.max_operator_version}: it would compute the old result, and no backport "
            f"changes that",
        )
    lacking = sorted(op for op in operators if op in spec.lacks)
    if lacking:
        return Verdict(
            spec.version,
            False,
            False,
            f"{name} lacks {', '.join(lacking)} (newer than it): optimize with "
            f"target_runtime={spec.version!r} to write it out",
        )
    if op_version > spec.max_operator_version:
        return Verdict(
            spec.version,
            False,
            False,
            f"the file is written for operator version {op_version}, {name} reads up to "
            f"{spec.max_operator_version}",
        )
    if runtime_operators is not None:
        missing = _missing(operators, runtime_operators)
        if missing:
            return Verdict(spec.version, False, False, f"{name} lacks {', '.join(missing)}")
    low, high = spec.bytecode_range
    if bytecode > high:
        can = high >= LOWEST_BACKPORT
        fix = f"backport to bytecode {high}" if can else "no backport reaches it"
        return Verdict(
            spec.version,
            False,
            can,
            f"bytecode {bytecode} is newer than {name}'s {low}-{high}: {fix}",
        )
    if bytecode < low:
        return Verdict(
            spec.version,
            False,
            False,
            f"bytecode {bytecode} is older than {name}'s {low}-{high}: save it again with a "
            f"newer torch",
        )
    return Verdict(
        spec.version,
        True,
        True,
        f"bytecode {bytecode} within {low}-{high}, operator version {op_version} of up to "
        f"{spec.max_operator_version}",
    )


def _missing(operators: Mapping[str, int], runtime: Mapping[str, int]) -> list[str]:
    found = []
    for name, count in sorted(operators.items()):
        if name not in runtime:
            found.append(name)
        elif runtime[name] < count:
            found.append(f"{name} with {count} arguments (it takes {runtime[name]})")
    return found


def backport_for(target_runtime: str, file: Path | str | bytes) -> bytes:
    """The file's bytes, backported to the newest bytecode ``target_runtime`` reads when it is
    newer than that (unchanged otherwise); refuses, naming the operator, when an operator has a
    meaning newer than the runtime, and when no backport reaches it."""
    spec = runtime_spec(target_runtime)
    data = read_bytes(file)
    found = file_compatibility(data)
    verdict = found.verdicts[spec.version]
    if verdict.loads:
        return data
    if not verdict.after_backport:
        raise IncompatibleRuntimeError(
            f"torch {spec.version} cannot load this file, and backporting cannot change that: "
            f"{verdict.reason}"
        )
    return backport_to_bytecode(data, spec.bytecode_range[1])


def backport_to_bytecode(file: Path | str | bytes, version: int) -> bytes:
    """The file rewritten as bytecode ``version`` (for an app's runtime older than the
    reference ones, e.g. one whose refusal says "must be between 3 and 7"); checked afterwards,
    because torch's backport returns empty bytes instead of raising when it cannot."""
    data = read_bytes(file)
    current = bytecode_version(data)
    if version == current:
        return data
    if version > current:
        raise InvalidValueError(
            f"the file has bytecode {current}; a backport only lowers it (asked for {version})"
        )
    for family in OpFamily:  # backporting loads the module: its context classes must exist
        ensure_registered(family)
    out = torch.jit.mobile._backport_for_mobile_to_buffer(io.BytesIO(data), version)
    if not out or not zipfile.is_zipfile(io.BytesIO(out)) or bytecode_version(out) != version:
        raise IncompatibleRuntimeError(
            f"torch {torch.__version__.split('+')[0]} cannot backport this file from bytecode "
            f"{current} to {version}; it writes bytecode {LOWEST_BACKPORT} to {current}"
        )
    return out


def _require_bytecode(data: bytes) -> None:
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise InvalidValueError("not a TorchScript file (not a zip archive)")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        if not any(n.endswith("/bytecode.pkl") for n in archive.namelist()):
            raise InvalidValueError(
                "the file has no lite-interpreter bytecode (torch.jit.save writes none); save it "
                "with _save_for_lite_interpreter, or fxmobile optimize -o out.ptl"
            )
