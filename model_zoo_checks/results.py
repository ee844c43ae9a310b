"""One zoo model on one backend: what the run measured, as plain data that round-trips JSON."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar


class Status(enum.StrEnum):
    PASSED = "passed"  # optimized; numerics (and top-5) within bounds
    FAILED = "failed"  # optimized, but the numerics or the top-5 check failed
    ERROR = "error"  # raised (or its child process died): see ``error``
    UNSUPPORTED = "unsupported"  # the catalogue says fxmobile cannot take it; not run
    SKIPPED = "skipped"  # not run on request (--skip-giants)

    @property
    def ran(self) -> bool:
        return self in (Status.PASSED, Status.FAILED, Status.ERROR)


@dataclass
class ModelResult:
    key: str  # ZooModel.key: name, or name@HxW for a resized copy
    name: str
    kind: str
    family: str
    backend: str  # cpu, vulkan, metal
    route: str  # fx or script
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

    def to_dict(self) -> dict[str, Any]:
        return {**record_to_dict(self), "latency_ratio": self.latency_ratio}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelResult:
        return record_from_dict(cls, data)


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
