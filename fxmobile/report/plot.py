"""``Report.plot()``: what each pass cost and changed, and the latency, as one matplotlib figure.

Three panels share one row per pass record, in pipeline order and coloured by stage (fx,
script, export, lower): the milliseconds it took (log scale when the times span more than a
hundredfold), the graph's nodes and the parameter bytes after it, each with a black tick where
it started and the change written beside it. Steps that are not passes (torch.export, lowering)
have no parameter bar; blocklisted passes have no bars at all. When the report holds latency,
a panel below draws each candidate's calls: every call a dot, the 10th-90th percentile a bar
and the median a tick.

matplotlib is imported here only, when a figure is asked for. The figure is closed in pyplot
before it is returned: a notebook shows it once (as the cell's value) and a script saves it with
``fig.savefig(path)``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fxmobile.errors import InvalidValueError, MissingDependencyError
from fxmobile.report.records import PassRecord, Report, Stage, Status
from fxmobile.report.render import format_bytes
from fxmobile.timing import Timing

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

STAGE_COLORS = {
    Stage.FX: "tab:blue",
    Stage.SCRIPT: "tab:orange",
    Stage.EXPORT: "tab:green",
    Stage.LOWER: "tab:purple",
}
ROW_INCHES = 0.26  # the height of one pass's row


def _pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError(
            "Report.plot() draws with matplotlib, which is not installed: "
            "`pip install matplotlib` (or `pip install 'fxmobile[zoo]'`)"
        ) from exc
    return plt


def plot(report: Report) -> Figure:
    """The report's passes (time, nodes, parameter bytes) and latency, as a Figure."""
    records, latency = report.passes, report.latency or {}
    if not records and not latency:
        raise InvalidValueError(
            f"the report of {report.model_name} has no pass records and no latency to plot; "
            "plot the report an optimize call returned (result.report)"
        )
    plt = _pyplot()
    pass_height = ROW_INCHES * len(records) + 1.2 if records else 0.0
    latency_height = 0.45 * len(latency) + 1.3 if latency else 0.0
    fig = plt.figure(figsize=(14, pass_height + latency_height), layout="constrained")
    grid = fig.add_gridspec(
        2 if records and latency else 1,
        3,
        height_ratios=[h for h in (pass_height, latency_height) if h],
        width_ratios=[1.25, 1, 1],
    )
    if records:
        times = fig.add_subplot(grid[0, 0])
        nodes = fig.add_subplot(grid[0, 1], sharey=times)
        params = fig.add_subplot(grid[0, 2], sharey=times)
        _times(times, records)
        _changes(nodes, records, "nodes", _nodes, lambda change: f"{change:+.0f}")
        unit, scale = _unit(max(max(r.param_bytes_before, r.param_bytes_after) for r in records))
        _changes(params, records, f"parameters ({unit})", _param_bytes(scale), _scaled(unit))
        _legend(fig, records)
    if latency:
        _latency(fig.add_subplot(grid[-1, :]), latency)
    backend = f" for {report.backend}" if report.backend else ""
    fig.suptitle(f"fxmobile: {report.model_name}{backend}", fontsize=12)
    plt.close(fig)
    return fig


def _label(rec: PassRecord) -> str:
    return rec.name + (" (blocklisted)" if rec.status is Status.BLOCKLISTED else "")


def _rows(ax: Axes, records: Sequence[PassRecord]) -> list[int]:
    """One row per record, the first at the top."""
    ys = list(range(len(records)))
    ax.set_yticks(ys, [_label(r) for r in records], fontsize=8)
    ax.set_ylim(len(records) - 0.5, -0.5)
    ax.grid(axis="x", alpha=0.3)
    return ys


def _times(ax: Axes, records: Sequence[PassRecord]) -> None:
    ys = _rows(ax, records)
    ms = [r.seconds * 1000 if r.status is Status.RAN else 0.0 for r in records]
    ax.barh(ys, ms, color=[STAGE_COLORS[r.stage] for r in records])
    positive = [m for m in ms if m > 0]
    if positive and max(positive) > 100 * min(positive):
        ax.set_xscale("log")
        ax.set_xlim(min(positive) / 2, max(positive) * 4)
        ax.set_title("time per pass (ms, log scale)", fontsize=10)
    else:
        ax.set_xlim(0, max(positive, default=1.0) * 1.25)
        ax.set_title("time per pass (ms)", fontsize=10)
    for y, m, rec in zip(ys, ms, records, strict=True):
        if rec.status is Status.RAN:
            ax.annotate(
                f"{m:.1f}",
                (m, y),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
            )


def _nodes(rec: PassRecord) -> tuple[float, float] | None:
    return (rec.nodes_before, rec.nodes_after) if rec.status is Status.RAN else None


def _param_bytes(scale: float) -> Any:
    def measure(rec: PassRecord) -> tuple[float, float] | None:
        if rec.status is not Status.RAN or rec.step:
            return None
        return rec.param_bytes_before / scale, rec.param_bytes_after / scale

    return measure


def _unit(largest: int) -> tuple[str, float]:
    """The unit ``format_bytes`` would print ``largest`` in, and its size in bytes."""
    unit = format_bytes(largest).split()[-1]
    return unit, float(1024 ** ("B", "KiB", "MiB", "GiB").index(unit))


def _scaled(unit: str) -> Any:
    return lambda change: f"{change:+.2f} {unit}" if unit != "B" else f"{change:+.0f} B"


def _changes(
    ax: Axes, records: Sequence[PassRecord], title: str, measure: Any, describe: Any
) -> None:
    """A bar at each record's value after it, a tick where it started, and the change."""
    ys = _rows(ax, records)
    ax.tick_params(axis="y", labelleft=False)
    found = [measure(r) for r in records]
    largest = max((max(m) for m in found if m is not None), default=1.0) or 1.0
    for y, rec, m in zip(ys, records, found, strict=True):
        if m is None:
            continue
        before, after = m
        ax.barh(y, after, color=STAGE_COLORS[rec.stage], alpha=0.75)
        ax.plot([before, before], [y - 0.4, y + 0.4], color="black", linewidth=1.2)
        if before != after:
            ax.annotate(
                describe(after - before),
                (max(before, after), y),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
            )
    ax.set_xlim(0, largest * 1.3)
    ax.set_title(f"{title} after each pass (tick: before)", fontsize=10)


def _legend(fig: Figure, records: Sequence[PassRecord]) -> None:
    from matplotlib.patches import Patch

    stages = [s for s in Stage if any(r.stage is s for r in records)]
    handles = [Patch(color=STAGE_COLORS[s], label=f"{s.value} stage") for s in stages]
    fig.legend(handles=handles, loc="outside upper right", ncols=len(handles), fontsize=8)


def _latency(ax: Axes, latency: dict[str, Timing]) -> None:
    """Each candidate's calls as dots (jittered up and down), p10-p90 as a bar, the median a
    tick; a timing without its samples (read back from JSON) draws the bar and tick alone."""
    names = list(latency)
    jitter = random.Random(0)
    for y, name in enumerate(names):
        t = latency[name]
        color = f"C{y % 10}"
        if t.samples_ms:
            ys = [y + jitter.uniform(-0.18, 0.18) for _ in t.samples_ms]
            ax.scatter(t.samples_ms, ys, s=10, alpha=0.45, color=color, linewidths=0)
        ax.plot([t.p10_ms, t.p90_ms], [y, y], color=color, linewidth=6, alpha=0.5)
        ax.plot([t.median_ms] * 2, [y - 0.3, y + 0.3], color="black", linewidth=2)
        ax.annotate(
            f"median {t.median_ms:.2f} ms, p10 {t.p10_ms:.2f}, p90 {t.p90_ms:.2f} "
            f"({t.runs} runs)",
            (t.p90_ms, y), xytext=(8, 0), textcoords="offset points", va="center", fontsize=8,
        )  # fmt: skip
    ax.set_yticks(range(len(names)), names, fontsize=9)
    ax.set_ylim(len(names) - 0.5, -0.5)
    slowest = max(max(t.samples_ms, default=t.p90_ms) for t in latency.values())
    ax.set_xlim(0, slowest * 1.6)
    ax.set_xlabel("ms per call")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("latency (dots: calls; bar: 10th to 90th percentile; tick: median)", fontsize=10)
