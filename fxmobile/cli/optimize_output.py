"""How ``fxmobile optimize`` prints what it found: tables (terminal or Markdown) or JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fxmobile.api import MobileResult
from fxmobile.cli.common import TABLE_FORMATS, table
from fxmobile.report import OutputCheck, Report
from fxmobile.report.render import format_bytes, numerics_table
from fxmobile.runtime.against_upstream import AgainstUpstream
from fxmobile.timing import Timing


@dataclass
class Outcome:
    """Everything the command found, for printing in any format."""

    result: MobileResult
    reference: str  # what the outputs are checked against: "eager" or "original TorchScript"
    output: Path
    seconds: float
    notes: list[str]
    lite_checks: list[OutputCheck] | None = None
    lite_skipped: str | None = None
    latency: dict[str, Timing] | None = None
    threads: int = 0
    latency_skipped: str | None = None
    kernels: str = ""  # what the optimized module's prepacked ops ran on here
    runtimes: AgainstUpstream | None = None  # --runtime: the file on the reference runtimes
    failures: list[str] = field(default_factory=list)


def render_report(report: Report, fmt: str) -> str:
    """The report alone (what is printed when the numerical check stops the command)."""
    if fmt == "json":
        return json.dumps({"report": report.to_dict()}, indent=2)
    return str(report) if fmt == "table" else report.to_markdown()


def render(outcome: Outcome, fmt: str) -> str:
    """Everything the command found: the report, the file, its check and its latency."""
    if fmt == "json":
        return json.dumps(_to_dict(outcome), indent=2)
    report = outcome.result.report
    parts = [render_report(report, fmt)]
    size = format_bytes(outcome.output.stat().st_size)
    checked = f", checked in {report.check_seconds:.1f} s" if report.check_seconds else ""
    optimized = report.optimize_seconds or outcome.seconds
    parts.append(f"optimized in {optimized:.1f} s{checked}; saved {outcome.output} ({size})")
    versus = f"lite interpreter vs {outcome.reference}"
    if outcome.lite_checks is not None:
        parts.append(f"{versus}:\n" + numerics_table(outcome.lite_checks, TABLE_FORMATS[fmt]))
    else:
        parts.append(f"{versus}: not checked, {outcome.lite_skipped}")
    if outcome.latency is not None:
        parts.append(_latency_table(outcome, fmt))
    elif outcome.latency_skipped:
        parts.append(f"latency: not measured, {outcome.latency_skipped}")
    if outcome.runtimes is not None:
        parts.append(outcome.runtimes.render(TABLE_FORMATS[fmt]))
    return "\n\n".join(parts)


def _latency_table(outcome: Outcome, fmt: str) -> str:
    timings = outcome.latency or {}
    base = timings[outcome.reference].median_ms
    here = f"torch {torch.__version__.split('+')[0]} (this process)"
    kernels = {
        outcome.reference: "ATen",
        "optimized TorchScript": outcome.kernels,
        "lite interpreter": outcome.kernels,
    }
    rows: list[list[object]] = [
        [
            name,
            here,
            kernels[name],
            f"{timings[name].median_ms:.2f}",
            f"{timings[name].p10_ms:.2f}",
            f"{timings[name].p90_ms:.2f}",
            f"{base / timings[name].median_ms:.2f}×",
        ]
        for name in (outcome.reference, "optimized TorchScript", "lite interpreter")
    ]
    headers = ["latency", "runs on", "kernels", "median ms", "p10 ms", "p90 ms"]
    headers.append(f"speed-up vs {outcome.reference}")
    runs = timings[outcome.reference].runs
    threads = f"{outcome.threads} thread" + ("s" if outcome.threads != 1 else "")
    caption = f"({runs} rounds, candidates interleaved in random order, {threads})"
    return table(rows, headers, fmt) + "\n" + caption


def _to_dict(outcome: Outcome) -> dict[str, Any]:
    return {
        "output": str(outcome.output),
        "reference": outcome.reference,
        "file_bytes": outcome.output.stat().st_size,
        "seconds": outcome.seconds,
        "report": outcome.result.report.to_dict(),
        "lite_numerics": None
        if outcome.lite_checks is None
        else [c.to_dict() for c in outcome.lite_checks],
        "lite_numerics_skipped": outcome.lite_skipped,
        "latency": None
        if outcome.latency is None
        else {name: t.to_dict() for name, t in outcome.latency.items()},
        "latency_skipped": outcome.latency_skipped,
        "threads": outcome.threads or None,
        "notes": outcome.notes,
        "runtimes": None if outcome.runtimes is None else outcome.runtimes.to_dict(),
        "failures": outcome.failures,
    }
