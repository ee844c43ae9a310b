"""The report's data: one record per pass, the numerical check, and notes.

Everything here is plain data (dataclasses of numbers and strings); ``fxmobile.report.render``
turns it into a table or Markdown, ``html`` into a notebook's view, ``plot`` into a figure,
``frame`` into pandas DataFrames, and ``to_dict`` into JSON-ready data. Nothing is parsed back
out of text.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fxmobile.timing import Timing

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from pandas import DataFrame


class Stage(enum.Enum):
    """The pipeline stage a pass belongs to: the FX graph or the TorchScript module."""

    FX = "fx"
    SCRIPT = "script"
    EXPORT = "export"  # torch.export, and passes on the exported ATen graph (ExecuTorch target)
    LOWER = "lower"  # ExecuTorch's edge dialect, the XNNPACK partitioner, the program


class Status(enum.Enum):
    """Whether a pass ran or the blocklist switched it off."""

    RAN = "ran"
    BLOCKLISTED = "blocklisted"


@dataclass(frozen=True)
class PassRecord:
    """What one pass did: rewrites, skips with reasons, and the graph before and after."""

    name: str
    stage: Stage
    status: Status
    member: str | None = None  # the MobileOptimizerType member that switches it off, if any
    rewrites: int = 0
    skips: dict[str, int] = field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0
    param_bytes_before: int = 0
    param_bytes_after: int = 0
    seconds: float = 0.0
    # A step that is not a pass (torch.export, ExecuTorch's lowering): it rewrites nothing and
    # its graph holds no parameters to count, so the tables leave those cells blank.
    step: bool = False

    @property
    def modified(self) -> bool:
        return self.rewrites > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage.value,
            "status": self.status.value,
            "member": self.member,
            "rewrites": self.rewrites,
            "skips": dict(self.skips),
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "param_bytes_before": self.param_bytes_before,
            "param_bytes_after": self.param_bytes_after,
            "seconds": self.seconds,
            "step": self.step,
        }


@dataclass(frozen=True)
class OutputCheck:
    """The optimized model's output number ``index`` (flattened) against eager."""

    index: int
    path: str
    max_abs_error: float
    reference_scale: float
    tolerance: float

    @property
    def relative_error(self) -> float:
        """Max abs error relative to the largest magnitude in the eager output."""
        if self.reference_scale == 0.0:
            return self.max_abs_error
        return self.max_abs_error / self.reference_scale

    @property
    def passed(self) -> bool:
        return self.relative_error <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "path": self.path,
            "max_abs_error": self.max_abs_error,
            "reference_scale": self.reference_scale,
            "relative_error": self.relative_error,
            "tolerance": self.tolerance,
            "passed": self.passed,
        }


@dataclass(frozen=True)
class HookRecord:
    """One module hook capture met, and what it did with it."""

    module: str  # qualified name, "" for the model itself
    kind: str  # "forward pre-hook", "forward hook (with kwargs)", "backward hook"
    hook: str  # the hook function's qualified name
    action: str  # traced into the graph, kept with its module (and why), or no effect

    def to_dict(self) -> dict[str, str]:
        return {"module": self.module, "kind": self.kind, "hook": self.hook, "action": self.action}


@dataclass(frozen=True)
class FileFacts:
    """What the lite-interpreter file of the result is: its size and, from torch's mobile
    compatibility API, its versions and which reference runtime loads it."""

    nbytes: int
    compatibility: dict[str, Any] | None = None  # fxmobile.runtime.compat.FileCompatibility


@dataclass(frozen=True)
class PortableOp:
    """An operator an ExecuTorch program runs on portable kernels, outside every delegate."""

    op: str  # the edge operator, "aten::native_layer_norm"
    count: int
    reason: str  # why the XNNPACK partitioner left it out

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "count": self.count, "reason": self.reason}


@dataclass(frozen=True)
class ProgramFacts:
    """What an ExecuTorch program is: its size, its delegate calls, what runs outside them."""

    nbytes: int
    delegate_calls: int  # calls into the XNNPACK delegate, one per partition
    delegated_ops: int  # edge operators inside those partitions
    portable_ops: tuple[PortableOp, ...] = ()

    @property
    def portable_count(self) -> int:
        """Operator calls left on portable kernels."""
        return sum(p.count for p in self.portable_ops)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nbytes": self.nbytes,
            "delegate_calls": self.delegate_calls,
            "delegated_ops": self.delegated_ops,
            "portable_ops": [p.to_dict() for p in self.portable_ops],
        }


@dataclass
class Report:
    """Everything fxmobile did to one model, in order."""

    model_name: str
    passes: list[PassRecord] = field(default_factory=list)
    numerics: list[OutputCheck] | None = None
    notes: list[str] = field(default_factory=list)
    backend: str | None = None
    # exported operator kinds and their counts, before and after the TorchScript stage
    ops_before: dict[str, int] | None = None
    ops_after: dict[str, int] | None = None
    # ops a mobile runtime still dispatches one by one (see script.graph_utils.unfused_ops)
    unfused_ops: dict[str, int] | None = None
    # The lite-interpreter file, measured on first read: serializing resnet50 takes about as
    # long as scripting it, and many callers never look (see ``measure_file_with``).
    _file: FileFacts | None = field(default=None, repr=False)
    _measure_file: Callable[[], FileFacts] | None = field(default=None, repr=False, compare=False)
    lints: list[dict[str, str]] | None = None  # generate_mobile_module_lints of the result
    # how the model became a graph ("torch.fx", "torch.fx (shape-aware)", "torch.jit.trace",
    # "torch.jit.script", "TorchScript input"), and why each route before it was declined
    route: str | None = None
    declined: list[str] = field(default_factory=list)
    hooks: list[HookRecord] = field(default_factory=list)
    # parametrizations evaluated into plain parameters, by kind (weight_norm, _SpectralNorm...)
    parametrizations: dict[str, int] = field(default_factory=dict)
    # the ExecuTorch program (target_runtime="executorch"): size, delegates, portable ops
    program: ProgramFacts | None = None
    optimize_seconds: float | None = None  # the passes, scripting and freezing
    check_seconds: float | None = None  # eager's reference run and the optimized module's run
    # per-call latency by candidate ("eager", "lite interpreter"...), when it was measured
    latency: dict[str, Timing] | None = None

    @property
    def file(self) -> FileFacts | None:
        """The lite-interpreter file's size and compatibility (measured on first read)."""
        if self._file is None and self._measure_file is not None:
            self._file, self._measure_file = self._measure_file(), None
        return self._file

    @file.setter
    def file(self, facts: FileFacts | None) -> None:
        self._file, self._measure_file = facts, None

    @property
    def file_bytes(self) -> int | None:
        """Size of the lite-interpreter file."""
        return None if self.file is None else self.file.nbytes

    @property
    def compatibility(self) -> dict[str, Any] | None:
        """The file's bytecode and operator versions, and which reference runtime loads it."""
        return None if self.file is None else self.file.compatibility

    def measure_file_with(self, measure: Callable[[], FileFacts]) -> None:
        """Set ``file`` to ``measure()``, called when it is first read."""
        self._file, self._measure_file = None, measure

    @property
    def rewrites(self) -> int:
        return sum(p.rewrites for p in self.passes)

    @property
    def numerics_passed(self) -> bool | None:
        if self.numerics is None:
            return None
        return all(c.passed for c in self.numerics)

    def record(self, name: str) -> PassRecord:
        """The record of the pass called ``name`` (the last one, if it ran in two stages)."""
        for rec in reversed(self.passes):
            if rec.name == name:
                return rec
        raise KeyError(
            f"no pass named {name!r} in this report; ran: {[p.name for p in self.passes]}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "route": self.route,
            "declined": list(self.declined),
            "passes": [p.to_dict() for p in self.passes],
            "numerics": None if self.numerics is None else [c.to_dict() for c in self.numerics],
            "notes": list(self.notes),
            "backend": self.backend,
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "unfused_ops": self.unfused_ops,
            "file_bytes": self.file_bytes,
            "compatibility": self.compatibility,
            "lints": self.lints,
            "hooks": [h.to_dict() for h in self.hooks],
            "parametrizations": dict(self.parametrizations),
            "program": None if self.program is None else self.program.to_dict(),
            "optimize_seconds": self.optimize_seconds,
            "check_seconds": self.check_seconds,
            "latency": None
            if self.latency is None
            else {name: t.to_dict() for name, t in self.latency.items()},
        }

    def to_markdown(self) -> str:
        from fxmobile.report.render import render

        return render(self, "github")

    def __str__(self) -> str:
        from fxmobile.report.render import render

        return render(self, "simple")

    def __repr__(self) -> str:
        from fxmobile.report.summary import one_line

        return f"Report({one_line(self)})"

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        from fxmobile.report.html import report_html

        return report_html(self)

    def plot(self) -> Figure:
        """A matplotlib figure: each pass's time, nodes and parameter bytes before and after,
        and the latency distributions when the report holds latency (needs matplotlib)."""
        from fxmobile.report.plot import plot

        return plot(self)

    def to_dataframe(
        self, table: Literal["passes", "numerics", "latency", "portable_ops"] = "passes"
    ) -> DataFrame:
        """A pandas DataFrame (needs pandas): one row per pass record by default; ``table``
        picks another: ``"numerics"`` (per output), ``"latency"`` (one row per timed call) or
        ``"portable_ops"`` (the ExecuTorch program's ops outside the delegate)."""
        from fxmobile.report.frame import to_dataframe

        return to_dataframe(self, table)
