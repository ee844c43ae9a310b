"""The committed baseline, and what counts as a regression against it.

One entry per ``model/backend``. A run regresses when, for an entry in the baseline:

- status: the model passed before and now fails its checks or raises;
- relative_error: the error passed its bound. The bound is ``error_growth`` (10) times the
  baseline error, but at least ``error_floor`` (0.1) of the tolerance, so float noise near zero
  never counts; and, for a model that was within its tolerance, never above the tolerance;
- unfused_ops: more ops left unfused than before (the op structure is deterministic);
- latency_ratio: optimized/eager median latency above the baseline ratio by more than
  ``latency_margin`` (25%) of it, the noise a shared machine leaves in interleaved medians;
- runtime: on a reference runtime (``--runtime``) the file loaded before and now does not, or
  it matched eager before and now differs (or fails to run);
- runtime_ratio: fxmobile's file over upstream's ``optimize_for_mobile`` file, median latency
  on torch 2.12.1's XNNPACK, above the baseline ratio by more than ``latency_margin``;
- delegate_calls, portable_ops (``--runtime executorch``, whose baseline is a file of its own,
  ``baseline-executorch.json``): fxmobile's ExecuTorch program makes more calls into the XNNPACK
  delegate, or leaves more op calls on portable kernels, than before. Its status and relative
  error are its program's (a program that went through and no longer does is a status
  regression); ExecuTorch's own program is kept beside it for the reader, never compared.

A NaN error or ratio is never within a bound (every comparison is written ``not new <= bound``).
The run confirms a latency regression by timing the model again alone before reporting it
(``model_zoo_checks.confirm``).

Improvements, new models and models not run (skipped, unsupported) are never regressions; a
model that failed in the baseline and still fails is a known failure.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from model_zoo_checks.results import (
    FXMOBILE,
    NOT_LOADED,
    PASSED_ON_RUNTIME,
    ModelResult,
    ProgramRecord,
    Status,
    record_from_dict,
    record_to_dict,
)

VERSION = 1
DEFAULT_PATH = Path(__file__).with_name("baseline.json")
EXECUTORCH_PATH = Path(__file__).with_name("baseline-executorch.json")  # --runtime executorch


def default_path(executorch: bool) -> Path:
    """The committed baseline of a run: the lite-interpreter file's, or ExecuTorch's."""
    return EXECUTORCH_PATH if executorch else DEFAULT_PATH


@dataclass(frozen=True)
class Thresholds:
    """How far a metric may move from its baseline value before it counts as a regression.

    ``error_growth`` multiplies the baseline relative error, ``error_floor`` is the fraction of
    the model's tolerance below which an error never regresses, and ``latency_margin`` is the
    fraction a latency ratio may grow by (see the module docstring for the rules).
    """

    error_growth: float = 10.0
    error_floor: float = 0.1  # fraction of the tolerance
    latency_margin: float = 0.25

    def error_bound(self, old: float, tolerance: float) -> float:
        bound = max(old * self.error_growth, tolerance * self.error_floor)
        return min(bound, tolerance) if old <= tolerance else bound


class Metric(enum.StrEnum):
    """What a regression is about; each value is the field of ``BaselineEntry`` it compares
    (the last two: of its fxmobile ``ProgramEntry``)."""

    STATUS = "status"
    RELATIVE_ERROR = "relative_error"
    UNFUSED_OPS = "unfused_ops"
    LATENCY_RATIO = "latency_ratio"
    RUNTIME = "runtime"
    RUNTIME_RATIO = "runtime_ratio"
    DELEGATE_CALLS = "delegate_calls"
    PORTABLE_OPS = "portable_ops"


LATENCY_METRICS = frozenset({Metric.LATENCY_RATIO, Metric.RUNTIME_RATIO})


@dataclass(frozen=True)
class Regression:
    """One metric of one model on one backend that got worse than the baseline allows.

    ``old`` and ``new`` are the baseline's and the run's values, ``bound`` the largest new value
    that would have passed (None for status, runtime and unfused-op regressions), ``detail`` the
    error or the ops that grew. ``str()`` is the line the run prints.
    """

    key: str
    backend: str
    metric: Metric
    old: Any
    new: Any
    bound: Any = None  # the largest new value that would not have regressed
    detail: str = ""

    def __str__(self) -> str:
        bound = "" if self.bound is None else f" (bound {_fmt(self.bound)})"
        detail = f": {self.detail}" if self.detail else ""
        change = f"{_fmt(self.old)} -> {_fmt(self.new)}"
        return f"{self.key}/{self.backend}: {self.metric} {change}{bound}{detail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.key,
            "backend": self.backend,
            "metric": self.metric.value,
            "old": self.old,
            "new": self.new,
            "bound": self.bound,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class ProgramEntry:
    """What the baseline keeps of one flow's ExecuTorch program (``ProgramRecord``): no
    milliseconds or seconds, which do not carry from run to run."""

    through: bool
    passed: bool
    error: str | None = None
    relative_error: float | None = None
    delegate_calls: int | None = None
    portable_ops: int | None = None
    portable_by_op: dict[str, int] = field(default_factory=dict)
    nbytes: int | None = None

    @classmethod
    def from_record(cls, record: ProgramRecord) -> ProgramEntry:
        return cls(
            through=record.through,
            passed=record.passed,
            error=record.error,
            relative_error=record.relative_error,
            delegate_calls=record.delegate_calls,
            portable_ops=record.portable_ops,
            portable_by_op=dict(sorted(record.portable_by_op.items())),
            nbytes=record.nbytes,
        )


@dataclass(frozen=True)
class BaselineEntry:
    """What the baseline keeps of one ``ModelResult``: the figures a later run is compared on.

    Latency is kept as ratios only (optimized/eager, fxmobile/upstream on 2.12.1), never as
    milliseconds, since absolute times on a shared machine do not carry from run to run.
    """

    status: Status
    route: str = "fx"
    error: str | None = None
    relative_error: float | None = None
    tolerance: float | None = None
    top5_match: bool | None = None
    unfused_ops: int | None = None
    unfused_by_op: dict[str, int] = field(default_factory=dict)
    file_bytes: int | None = None
    latency_ratio: float | None = None
    runtimes: dict[str, str] = field(default_factory=dict)  # runtime -> RuntimeRecord.verdict
    runtime_ratio: float | None = None
    programs: dict[str, ProgramEntry] = field(default_factory=dict)  # --runtime executorch

    @classmethod
    def from_result(cls, result: ModelResult) -> BaselineEntry:
        return cls(
            status=result.status,
            route=result.route,
            error=result.error,
            relative_error=result.relative_error,
            tolerance=result.tolerance,
            top5_match=result.top5_match,
            unfused_ops=result.unfused_ops,
            unfused_by_op=dict(sorted(result.unfused_by_op.items())),
            file_bytes=result.file_bytes,
            latency_ratio=result.latency_ratio,
            runtimes={v: r.verdict for v, r in sorted(result.runtimes.items())},
            runtime_ratio=result.runtime_ratio,
            programs={f: ProgramEntry.from_record(p) for f, p in sorted(result.programs.items())},
        )

    def to_dict(self) -> dict[str, Any]:
        data = record_to_dict(self)
        if not self.programs:  # the lite-interpreter baseline reads as it did
            del data["programs"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BaselineEntry:
        entry = record_from_dict(cls, data)
        programs = {
            f: ProgramEntry(**p) if isinstance(p, Mapping) else p for f, p in entry.programs.items()
        }
        return dataclasses.replace(entry, programs=programs)


Baseline = dict[str, BaselineEntry]  # keyed by ModelResult.id: "resnet18/cpu"


def load(path: Path, executorch: bool | None = None) -> Baseline:
    """The baseline at ``path``; empty when the file does not exist. With ``executorch`` given,
    ``ValueError`` when the file is the other run's baseline (an ExecuTorch baseline's entries
    carry programs, the lite-interpreter baseline's do not)."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if data.get("version") != VERSION:
        raise ValueError(
            f"{path}: baseline version {data.get('version')!r}, this runner reads {VERSION}; "
            f"regenerate it with --update-baseline"
        )
    baseline = {key: BaselineEntry.from_dict(entry) for key, entry in data["entries"].items()}
    has_programs = any(entry.programs for entry in baseline.values())
    if baseline and executorch is not None and has_programs != executorch:
        which, right = (
            ("the lite-interpreter file's", EXECUTORCH_PATH)
            if executorch
            else ("an ExecuTorch run's", DEFAULT_PATH)
        )
        raise ValueError(
            f"{path} is {which} baseline, not this run's: pass --baseline {right.name} "
            f"(or leave --baseline out)"
        )
    return baseline


def save(baseline: Baseline, path: Path) -> None:
    """Write ``baseline`` to ``path`` as versioned JSON, entries sorted by key (stable diffs)."""
    entries = {key: baseline[key].to_dict() for key in sorted(baseline)}
    path.write_text(json.dumps({"version": VERSION, "entries": entries}, indent=1) + "\n")


def merged(baseline: Baseline, results: Iterable[ModelResult]) -> Baseline:
    """``baseline`` with the entries of the models that ran replaced; the rest kept.

    A run without latency (``--rounds 0``, or a GPU backend) keeps the baseline's ratios, and
    one without ``--runtime`` (or with one runtime) the runtimes it did not check.
    """
    out = dict(baseline)
    for result in results:
        if not result.status.ran:
            continue
        entry = BaselineEntry.from_result(result)
        old = baseline.get(result.id)
        if old is not None:
            entry = dataclasses.replace(
                entry,
                latency_ratio=_first(entry.latency_ratio, old.latency_ratio),
                runtime_ratio=_first(entry.runtime_ratio, old.runtime_ratio),
                runtimes=dict(sorted({**old.runtimes, **entry.runtimes}.items())),
            )
        out[result.id] = entry
    return out


def _first(value: float | None, fallback: float | None) -> float | None:
    return fallback if value is None else value


def compare(
    results: Iterable[ModelResult], baseline: Baseline, thresholds: Thresholds | None = None
) -> list[Regression]:
    """Every regression of ``results`` against ``baseline``, in result order."""
    limits = thresholds or Thresholds()
    found: list[Regression] = []
    for result in results:
        old = baseline.get(result.id)
        if old is not None and result.status.ran:
            found.extend(_regressions(result, old, limits))
    return found


def not_in_baseline(results: Iterable[ModelResult], baseline: Baseline) -> list[str]:
    """The ids (``model/backend``) of results that ran but have no baseline entry to compare."""
    return [r.id for r in results if r.status.ran and r.id not in baseline]


def _regressions(new: ModelResult, old: BaselineEntry, limits: Thresholds) -> list[Regression]:
    def regression(
        metric: Metric, before: Any, after: Any, bound: Any = None, detail: str = ""
    ) -> Regression:
        return Regression(new.key, new.backend, metric, before, after, bound, detail)

    found = []
    if old.status is Status.PASSED and not new.passed:
        found.append(regression(Metric.STATUS, "passed", str(new.status), detail=new.error or ""))
    # A baseline NaN error belongs to a model that failed then: its status says what changed.
    if new.relative_error is not None and _finite(old.relative_error):
        tolerance = new.tolerance if new.tolerance is not None else old.tolerance or 0.0
        bound = limits.error_bound(old.relative_error, tolerance)
        if not new.relative_error <= bound:
            found.append(
                regression(Metric.RELATIVE_ERROR, old.relative_error, new.relative_error, bound)
            )
    before, after = old.unfused_ops, new.unfused_ops
    if before is not None and after is not None and after > before:
        grown = _grown(old.unfused_by_op, new.unfused_by_op)
        found.append(regression(Metric.UNFUSED_OPS, before, after, detail=grown))
    for version, record in sorted(new.runtimes.items()):
        was = old.runtimes.get(version)
        stopped_loading = was not in (None, NOT_LOADED) and not record.loads
        if stopped_loading or (was == PASSED_ON_RUNTIME and not record.passed):
            detail = f"torch {version}: {record.error or 'outputs differ from eager'}"
            found.append(regression(Metric.RUNTIME, was, record.verdict, detail=detail))
    found += _program_regressions(new, old, regression)
    for metric, old_ratio, new_ratio in (
        (Metric.LATENCY_RATIO, old.latency_ratio, new.latency_ratio),
        (Metric.RUNTIME_RATIO, old.runtime_ratio, new.runtime_ratio),
    ):
        if new_ratio is not None and _finite(old_ratio):
            bound = old_ratio * (1 + limits.latency_margin)
            if not new_ratio <= bound:
                found.append(regression(metric, old_ratio, new_ratio, bound))
    return found


def _program_regressions(
    new: ModelResult, old: BaselineEntry, regression: Callable[..., Regression]
) -> list[Regression]:
    """More delegate calls or portable ops in fxmobile's ExecuTorch program than before."""
    ours, was = new.programs.get(FXMOBILE), old.programs.get(FXMOBILE)
    if ours is None or was is None:
        return []
    found = []
    if _grew(was.delegate_calls, ours.delegate_calls):
        found.append(
            regression(
                Metric.DELEGATE_CALLS,
                was.delegate_calls,
                ours.delegate_calls,
                detail="fxmobile's program makes more calls into the XNNPACK delegate",
            )
        )
    if _grew(was.portable_ops, ours.portable_ops):
        grown = _grown(was.portable_by_op, ours.portable_by_op)
        detail = f"fxmobile's program leaves more on portable kernels: {grown}"
        found.append(
            regression(Metric.PORTABLE_OPS, was.portable_ops, ours.portable_ops, None, detail)
        )
    return found


def _grew(before: int | None, after: int | None) -> bool:
    return before is not None and after is not None and after > before


def _finite(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def _grown(old: Mapping[str, int], new: Mapping[str, int]) -> str:
    """The ops whose unfused count grew: ``aten::add 2->4, aten::relu 0->1``."""
    grown = [(op, old.get(op, 0), n) for op, n in sorted(new.items()) if n > old.get(op, 0)]
    return ", ".join(f"{op} {a}->{b}" for op, a, b in grown)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)
