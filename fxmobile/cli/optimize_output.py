"""How ``fxmobile optimize`` prints what it found: tables (terminal or Markdown) or JSON."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxmobile.api import MobileResult, ProgramResult
from fxmobile.cli.common import TABLE_FORMATS
from fxmobile.cli.latency import Timed
from fxmobile.report import OutputCheck, Report
from fxmobile.report.render import format_bytes, numerics_table
from fxmobile.runtime.against_upstream import AgainstUpstream


@dataclass
class Outcome:
    """Everything the command found, for printing in any format."""

    result: MobileResult | ProgramResult
    reference: str  # what the outputs are checked against: "eager" or "original TorchScript"
    output: Path
    seconds: float
    notes: list[str]
    file_label: str = "lite interpreter"  # what ran the written file for its check
    file_checks: list[OutputCheck] | None = None
    file_skipped: str | None = None
    bundled: list[str] | None = None  # the inputs bundled into a .ptl, one line each
    bundled_note: str | None = None  # why none were, when none were
    timed: Timed | None = None  # --latency, in a clean child
    latency_skipped: str | None = None
    threads: int = 0  # --runtime: the threads of every process
    runtimes: AgainstUpstream | None = None  # --runtime: the file on the reference runtimes
    warnings: list[str] = field(default_factory=list)  # for stderr: a busy machine
    failures: list[str] = field(default_factory=list)


def render_report(report: Report, fmt: str) -> str:
    """The report alone (what is printed when the numerical check stops the command).

    In tables, without its latency: the command prints the fuller table (where each candidate
    ran, on which kernels, the speed-ups and the threads) after the file's check."""
    if fmt == "json":
        return json.dumps({"report": report.to_dict()}, indent=2)
    if report.latency:
        report = dataclasses.replace(report, latency=None)
    return str(report) if fmt == "table" else report.to_markdown()


def render(outcome: Outcome, fmt: str) -> str:
    """Everything the command found: the report, the file, its check and its latency."""
    if fmt == "json":
        return json.dumps(_to_dict(outcome), indent=2)
    report = outcome.result.report
    parts = [render_report(report, fmt)]
    if outcome.bundled is not None:
        parts.append("bundled inputs for forward: " + "; ".join(outcome.bundled))
    elif outcome.bundled_note is not None:
        parts.append(f"bundled inputs: {outcome.bundled_note}")
    size = format_bytes(outcome.output.stat().st_size)
    checked = f", checked in {report.check_seconds:.1f} s" if report.check_seconds else ""
    optimized = report.optimize_seconds or outcome.seconds
    parts.append(f"optimized in {optimized:.1f} s{checked}; saved {outcome.output} ({size})")
    versus = f"{outcome.file_label} vs {outcome.reference}"
    if outcome.file_checks is not None:
        parts.append(f"{versus}:\n" + numerics_table(outcome.file_checks, TABLE_FORMATS[fmt]))
    else:
        parts.append(f"{versus}: not checked, {outcome.file_skipped}")
    if outcome.timed is not None:
        parts.append(outcome.timed.render(fmt))
    elif outcome.latency_skipped:
        parts.append(f"latency: not measured, {outcome.latency_skipped}")
    if outcome.runtimes is not None:
        parts.append(outcome.runtimes.render(TABLE_FORMATS[fmt]))
        if outcome.runtimes.latency is not None:
            parts.append(
                f"(candidates interleaved in random order; {outcome.threads} threads in every "
                f"process; eager in this process, the others in child processes with "
                f"OMP_WAIT_POLICY=PASSIVE unless set)"
            )
    return "\n\n".join(parts)


def _to_dict(outcome: Outcome) -> dict[str, Any]:
    return {
        "output": str(outcome.output),
        "reference": outcome.reference,
        "file_bytes": outcome.output.stat().st_size,
        "seconds": outcome.seconds,
        "report": outcome.result.report.to_dict(),
        "file_run_by": outcome.file_label,
        "file_numerics": None
        if outcome.file_checks is None
        else [c.to_dict() for c in outcome.file_checks],
        "file_numerics_skipped": outcome.file_skipped,
        "bundled_inputs": outcome.bundled,
        "bundled_inputs_note": outcome.bundled_note,
        "latency": None if outcome.timed is None else outcome.timed.to_dict(),
        "latency_skipped": outcome.latency_skipped,
        "notes": outcome.notes,
        "runtimes": None if outcome.runtimes is None else outcome.runtimes.to_dict(),
        "warnings": outcome.warnings,
        "failures": outcome.failures,
    }
