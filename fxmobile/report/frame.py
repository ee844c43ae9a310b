"""``Report.to_dataframe()``: the report's tables as pandas DataFrames, for a notebook to sort,
filter and plot.

``"passes"`` (the default) has one row per pass record; ``"numerics"`` one per checked output;
``"latency"`` one per timed call (long form, for a histogram or a box plot per candidate);
``"portable_ops"`` one per op an ExecuTorch program leaves outside the delegate. A value that
does not apply is missing (``<NA>``), never a zero: a blocklisted pass has no time, a step that
is not a pass (torch.export, lowering) has no rewrites and no parameter bytes.
pandas is imported here only, when a frame is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fxmobile.errors import InvalidValueError, MissingDependencyError
from fxmobile.report.records import PassRecord, Report, Status

if TYPE_CHECKING:
    from pandas import DataFrame

TABLES = ("passes", "numerics", "latency", "portable_ops")
_INTEGERS = (
    "rewrites",
    "skipped",
    "nodes_before",
    "nodes_after",
    "param_bytes_before",
    "param_bytes_after",
)


def _pandas() -> Any:
    try:
        import pandas
    except ImportError as exc:
        raise MissingDependencyError(
            "Report.to_dataframe() needs pandas, which is not installed: `pip install pandas`"
        ) from exc
    return pandas


def to_dataframe(report: Report, table: str = "passes") -> DataFrame:
    """The report's ``table`` (one of ``TABLES``) as a DataFrame."""
    if table not in TABLES:
        raise InvalidValueError(
            f"to_dataframe({table!r}): no such table; pass one of {', '.join(TABLES)}"
        )
    pd = _pandas()
    if table == "passes":
        frame = pd.DataFrame([_pass_row(r) for r in report.passes], columns=_PASS_COLUMNS)
        return frame.astype({column: "Int64" for column in _INTEGERS})
    if table == "numerics":
        rows = [c.to_dict() for c in report.numerics or []]
        columns = ["index", "path", "max_abs_error", "reference_scale", "relative_error"]
        return pd.DataFrame(rows, columns=[*columns, "tolerance", "passed"])
    if table == "latency":
        rows = [
            {"candidate": name, "run": run, "ms": ms}
            for name, timing in (report.latency or {}).items()
            for run, ms in enumerate(timing.samples_ms)
        ]
        return pd.DataFrame(rows, columns=["candidate", "run", "ms"])
    program = report.program
    rows = [p.to_dict() for p in program.portable_ops] if program else []
    return pd.DataFrame(rows, columns=["op", "count", "reason"])


_PASS_COLUMNS = [
    "stage",
    "name",
    "member",
    "status",
    "step",
    *_INTEGERS,
    "seconds",
    "skips",
]


def _pass_row(rec: PassRecord) -> dict[str, Any]:
    ran = rec.status is Status.RAN
    counted = ran and not rec.step
    return {
        "stage": rec.stage.value,
        "name": rec.name,
        "member": rec.member,
        "status": rec.status.value,
        "step": rec.step,
        "rewrites": rec.rewrites if counted else None,
        "skipped": sum(rec.skips.values()) if counted else None,
        "nodes_before": rec.nodes_before if ran else None,
        "nodes_after": rec.nodes_after if ran else None,
        "param_bytes_before": rec.param_bytes_before if counted else None,
        "param_bytes_after": rec.param_bytes_after if counted else None,
        "seconds": rec.seconds if ran else None,
        "skips": dict(rec.skips),
    }
