"""One zoo model on one backend: what the run measured, as plain data that round-trips JSON."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar


class Status(enum.StrEnum):
    """The outcome of one model on one backend; ``ran`` tells a check apart from a skip."""

    PASSED = "passed"  # optimized; numerics (and top-5) within bounds
    FAILED = "failed"  # optimized, but the numerics or the top-5 check failed
    ERROR = "error"  # raised (or its child process died): see ``error``
    UNSUPPORTED = "unsupported"  # the catalogue says fxmobile cannot take it; not run
    SKIPPED = "skipped"  # not run on request (--skip-giants)

    @property
    def ran(self) -> bool:
        return self in (Status.PASSED, Status.FAILED, Status.ERROR)


PASSED_ON_RUNTIME = "ok"
NOT_LOADED = "does not load"


@dataclass
class RuntimeRecord:
    """The model's saved CPU file in one reference runtime (``--runtime``), against eager."""

    runtime: str  # "2.12.1"
    kernels: str  # what its prepacked:: ops ran on there
    loads: bool
    passed: bool = False  # loads, runs, and every output within the model's tolerance
    relative_error: float | None = None
    error: str | None = None  # the runtime's own message when it did not load or run
    upstream_relative_error: float | None = None  # upstream optimize_for_mobile's file there

    @property
    def verdict(self) -> str:
        if self.passed:
            return PASSED_ON_RUNTIME
        return NOT_LOADED if not self.loads else "loads, differs or fails"


# The candidates of the latency run on 2.12.1 (``ModelResult.runtime_ms`` keys), and where each
# ran: a latency table names the runtime and the kernels of every figure.
RUNTIME_LATENCY = {
    "eager": "torch 2.15 here, ATen",
    "fxmobile": "fxmobile's file on torch 2.12.1, XNNPACK",
    "upstream": "upstream optimize_for_mobile's file on torch 2.12.1, XNNPACK",
}
LATENCY_RUNTIME = "2.12.1"  # the runtime with real XNNPACK kernels, where files are timed

# The two flows of ``--runtime executorch`` (``model_zoo_checks.on_executorch``), in table order.
FXMOBILE = "fxmobile"  # fxmobile.optimize(..., target_runtime="executorch"), its gate on
EXECUTORCH = "executorch"  # ExecuTorch's own flow: export, to_edge_transform_and_lower, program
FLOWS = (FXMOBILE, EXECUTORCH)


@dataclass
class ProgramRecord:
    """One flow's ExecuTorch program of one model (``--runtime executorch``), against eager."""

    flow: str  # FXMOBILE or EXECUTORCH
    through: bool = False  # made a program that ExecuTorch's runtime ran
    passed: bool = False  # through, and every output within the model's tolerance
    error: str | None = None  # why it did not go through, or the mismatch
    relative_error: float | None = None
    delegate_calls: int | None = None
    portable_ops: int | None = None  # op calls left on portable kernels
    portable_by_op: dict[str, int] = field(default_factory=dict)
    nbytes: int | None = None
    seconds: float | None = None  # making the program (fxmobile's: its checks included)
    median_ms: float | None = None  # batch 1, this process's ExecuTorch runtime, XNNPACK
    p10_ms: float | None = None

    @property
    def verdict(self) -> str:
        """``matched``, ``differs`` (through, outside the tolerance) or ``not through``."""
        if self.passed:
            return "matched"
        return "differs" if self.through else "not through"


@dataclass
class ModelResult:
    """Everything the run measured for one model on one backend (``id``: ``key/backend``).

    Latencies are medians in milliseconds at batch 1, CPU only: ``eager_ms`` and
    ``optimized_ms`` ran in this process on torch 2.15 (eager on ATen, the optimized module on
    fxmobile._C's kernels); ``runtime_ms`` ran on torch 2.12.1 (see ``RUNTIME_LATENCY``); a
    program's ``median_ms`` (``programs``) in this process's ExecuTorch runtime, on XNNPACK.
    Fields a run did not measure stay None or empty.
    """

    key: str  # ZooModel.key: name, or name@HxW for a resized copy
    name: str
    kind: str
    family: str
    backend: str  # cpu, vulkan, metal
    route: str  # fx or script (--runtime executorch: the eager model, whatever the route)
    input_shape: list[int]
    status: Status
    error: str | None = None  # "ExceptionType: first line", or the failed check
    relative_error: float | None = None  # max over outputs of max|opt - eager| / max|eager|
    tolerance: float | None = None
    top5_match: bool | None = None  # classifiers only
    unfused_ops: int | None = None  # total of report.unfused_ops
    unfused_by_op: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    file_bytes: int | None = None  # lite-interpreter file size
    optimize_seconds: float | None = None
    eager_ms: float | None = None  # median, batch 1 (CPU only)
    optimized_ms: float | None = None
    seconds: float = 0.0  # wall time for this model on this backend, build included
    notes: list[str] = field(default_factory=list)
    runtimes: dict[str, RuntimeRecord] = field(default_factory=dict)  # --runtime, CPU only
    runtime_ms: dict[str, float] = field(default_factory=dict)  # medians, RUNTIME_LATENCY keys
    runtime_p10_ms: dict[str, float] = field(default_factory=dict)
    # A flagged latency regression is timed again alone; the first figures are kept here.
    retimed_from: dict[str, float | None] = field(default_factory=dict)
    eager_p10_ms: float | None = None  # 10th percentile beside eager_ms
    # What the model was made for, as fxmobile.optimize's target_runtime: None (a lite file for
    # torch here), a reference runtime's version (--runtime), or "executorch" (its programs)
    target_runtime: str | None = None
    # --runtime executorch: each flow's program (FLOWS keys); status, error and relative_error
    # above are then fxmobile's program's, and no lite-interpreter file is made
    programs: dict[str, ProgramRecord] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.key}/{self.backend}"

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    @property
    def latency_ratio(self) -> float | None:
        """Optimized over eager median latency: below 1 is a speedup."""
        if self.eager_ms is None or self.optimized_ms is None or self.eager_ms <= 0:
            return None
        return self.optimized_ms / self.eager_ms

    @property
    def runtime_ratio(self) -> float | None:
        """fxmobile's file over upstream's, median latency on 2.12.1: below 1, fxmobile's is
        faster."""
        ours, theirs = self.runtime_ms.get("fxmobile"), self.runtime_ms.get("upstream")
        if ours is None or theirs is None or theirs <= 0:
            return None
        return ours / theirs

    def to_dict(self) -> dict[str, Any]:
        return {
            **record_to_dict(self),
            "latency_ratio": self.latency_ratio,
            "runtime_ratio": self.runtime_ratio,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelResult:
        result = record_from_dict(cls, data)
        result.runtimes = {
            v: RuntimeRecord(**r) if isinstance(r, Mapping) else r
            for v, r in result.runtimes.items()
        }
        result.programs = {
            flow: ProgramRecord(**p) if isinstance(p, Mapping) else p
            for flow, p in result.programs.items()
        }
        return result


R = TypeVar("R")


def record_to_dict(record: Any) -> dict[str, Any]:
    """A dataclass with a ``status`` as JSON-ready data (the status as its string)."""
    data = dataclasses.asdict(record)
    data["status"] = record.status.value
    return data


def record_from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
    """``cls`` back from ``record_to_dict`` data; keys that are not fields of ``cls`` (derived
    values, or fields of another record kind) are ignored."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {k: v for k, v in data.items() if k in names}
    values["status"] = Status(values["status"])
    return cls(**values)


def first_line(exc: BaseException) -> str:
    """``Type: first non-empty line of the message``, as the run records a failure."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
