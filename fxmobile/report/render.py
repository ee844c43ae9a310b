"""Render a ``Report`` as text tables (terminal or Markdown) with tabulate.

Each table is built once here as headers and rows of strings (``*_rows``); the text renderer
lays them out with tabulate and ``fxmobile.report.html`` with HTML, so both say the same.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from tabulate import tabulate

from fxmobile.report.records import OutputCheck, PassRecord, ProgramFacts, Report, Status
from fxmobile.timing import Timing

PASS_HEADERS = ["stage", "pass", "blocklist member", "rewrites", "nodes", "params", "ms"]
NUMERICS_HEADERS = ["output", "max abs err", "eager max abs", "relative", "tolerance", "check"]
LATENCY_HEADERS = ["candidate", "median ms", "p10 ms", "p90 ms", "runs"]
OPS_HEADERS = ["operator", "before", "after"]
HOOK_HEADERS = ["hooked module", "hook", "function", "what fxmobile did"]
PORTABLE_HEADERS = ["portable op", "calls", "why XNNPACK did not take it"]
COMPATIBILITY_HEADERS = ["reference runtime", "loads as saved", "after backport_for", "why"]


def format_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``: bytes in the largest unit that keeps the number under 1024."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def skips_text(rec: PassRecord) -> str:
    """``"weight shared ×2; conv output has 2 users ×1"``."""
    return "; ".join(f"{reason} ×{count}" for reason, count in rec.skips.items())


def pass_cells(rec: PassRecord) -> list[str]:
    """One pass record under ``PASS_HEADERS``. A step that is not a pass (torch.export,
    lowering) rewrites nothing and holds no parameters to count: those cells stay blank."""
    head = [rec.stage.value, rec.name, rec.member or "—"]
    if rec.status is Status.BLOCKLISTED:
        return [*head, "blocklisted", "", "", ""]
    params = f"{format_bytes(rec.param_bytes_before)} → {format_bytes(rec.param_bytes_after)}"
    return [
        *head,
        "" if rec.step else str(rec.rewrites),
        f"{rec.nodes_before} → {rec.nodes_after}",
        "" if rec.step else params,
        f"{rec.seconds * 1000:.1f}",
    ]


def numerics_rows(checks: list[OutputCheck]) -> list[list[str]]:
    """One row per checked output under ``NUMERICS_HEADERS``."""
    return [
        [
            c.path,
            f"{c.max_abs_error:.3g}",
            f"{c.reference_scale:.3g}",
            f"{c.relative_error:.3g}",
            f"{c.tolerance:.0e}",
            "ok" if c.passed else "MISMATCH",
        ]
        for c in checks
    ]


def latency_rows(latency: Mapping[str, Timing]) -> list[list[str]]:
    """One row per timed candidate under ``LATENCY_HEADERS``."""
    return [
        [name, f"{t.median_ms:.2f}", f"{t.p10_ms:.2f}", f"{t.p90_ms:.2f}", str(t.runs)]
        for name, t in latency.items()
    ]


def ops_rows(report: Report) -> list[list[str]]:
    """Each exported operator kind, most frequent after the TorchScript stage first."""
    before, after = report.ops_before or {}, report.ops_after or {}
    kinds = sorted(set(before) | set(after), key=lambda k: (-after.get(k, 0), k))
    return [[kind, str(before.get(kind, 0)), str(after.get(kind, 0))] for kind in kinds]


def hook_rows(report: Report) -> list[list[str]]:
    """One row per hook capture met, under ``HOOK_HEADERS``."""
    return [[h.module or "<model>", h.kind, h.hook, h.action] for h in report.hooks]


def portable_rows(program: ProgramFacts) -> list[list[str]]:
    """One row per operator left on portable kernels, under ``PORTABLE_HEADERS``."""
    return [[p.op, str(p.count), p.reason] for p in program.portable_ops]


def ranked(counts: Mapping[str, int], limit: int | None = None) -> str:
    """``{"a": 1, "b": 3}`` -> ``"b 3, a 1"``: the most frequent first, ``limit`` of them."""
    order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{k} {n}" for k, n in order[:limit])
    return shown + (", …" if limit is not None and len(order) > limit else "")


def unfused_line(unfused: Mapping[str, int]) -> str:
    """How many ops a mobile runtime still dispatches one by one, and which."""
    total = sum(unfused.values())
    if not total:
        return "ops left unfused: 0 (every tensor op runs in a packed kernel)"
    return f"ops left unfused: {total} ({ranked(unfused)})"


def program_head(program: ProgramFacts) -> str:
    """The ExecuTorch program in one sentence: size, delegate calls, ops on portable kernels."""
    return (
        f"ExecuTorch program: {format_bytes(program.nbytes)}, {program.delegate_calls} XNNPACK "
        f"delegate call(s) holding {program.delegated_ops} ops, "
        f"{program.portable_count} op call(s) on portable kernels"
    )


def render(report: Report, fmt: str) -> str:
    """The report as tables in tabulate format ``fmt`` ("simple" for terminals, "github")."""
    backend = f" for {report.backend}" if report.backend else ""
    parts = [f"fxmobile report: {report.model_name}{backend}"]
    if report.route:
        lines = [f"route: {report.route}"]
        lines += [f"  declined: {why}" for why in report.declined]
        parts.append("\n".join(lines))
    rows = [[*pass_cells(rec), skips_text(rec)] for rec in report.passes]
    parts.append(
        tabulate(
            rows,
            headers=[*PASS_HEADERS, "skipped (reason ×count)"],
            tablefmt=fmt,
            disable_numparse=True,
            colalign=["left"] * 3 + ["right", "left", "left", "right", "left"],
        )
    )
    if report.hooks:
        parts.append(
            tabulate(
                hook_rows(report),
                headers=HOOK_HEADERS,
                tablefmt=fmt,
                maxcolwidths=[None, None, 30, 60],
            )
        )
    if report.parametrizations:
        baked = ", ".join(f"{kind} {n}" for kind, n in sorted(report.parametrizations.items()))
        parts.append(f"parametrizations evaluated into plain parameters: {baked}")
    if report.numerics is not None:
        parts.append(numerics_table(report.numerics, fmt))
    if report.latency:
        parts.append(latency_table(report.latency, fmt))
    if report.ops_after is not None:
        parts.append(tabulate(ops_rows(report), headers=OPS_HEADERS, tablefmt=fmt))
    if report.unfused_ops is not None:
        parts.append(unfused_line(report.unfused_ops))
    if report.lints:
        rows = [[lint["name"], lint["message"]] for lint in report.lints]
        parts.append(
            tabulate(rows, headers=["lint", "message"], tablefmt=fmt, maxcolwidths=[None, 90])
        )
    if report.program is not None:
        parts.append(program_summary(report.program, fmt))
    if report.file_bytes is not None:
        parts.append(f"lite-interpreter file: {format_bytes(report.file_bytes)}")
    if report.compatibility is not None:
        parts.append(compatibility_table(report.compatibility, fmt))
    parts.extend(f"note: {note}" for note in report.notes)
    return "\n\n".join(parts)


def program_summary(program: ProgramFacts, fmt: str) -> str:
    """The ExecuTorch program: size, delegate calls, and each op left on portable kernels."""
    if not program.portable_ops:
        return program_head(program)
    table = tabulate(
        portable_rows(program),
        headers=PORTABLE_HEADERS,
        tablefmt=fmt,
        maxcolwidths=[None, None, 70],
    )
    return program_head(program) + "\n\n" + table


def numerics_table(checks: list[OutputCheck], fmt: str) -> str:
    """One row per checked output: its error against eager and whether it passed."""
    return tabulate(numerics_rows(checks), headers=NUMERICS_HEADERS, tablefmt=fmt)


def latency_table(latency: Mapping[str, Timing], fmt: str) -> str:
    """One row per timed candidate: median, 10th and 90th percentile ms, and the runs."""
    return "latency, ms per call:\n" + tabulate(
        latency_rows(latency),
        headers=LATENCY_HEADERS,
        tablefmt=fmt,
        disable_numparse=True,
        colalign=["left", "right", "right", "right", "right"],
    )


def compatibility_parts(found: Mapping[str, Any]) -> tuple[str, list[list[str]], str]:
    """``FileCompatibility.to_dict()`` for people: the versions and the operators whose meaning
    changed, a row per reference runtime (``COMPATIBILITY_HEADERS``), and the oldest one."""
    changed = found["versioned_operators"]
    listed = ", ".join(f"{op['name']} {op['version']}" for op in changed) if changed else "none"
    head = (
        f"mobile compatibility: bytecode {found['bytecode_version']}, operator version "
        f"{found['operator_version']}; operators whose meaning torch changed, and at which "
        f"operator version: {listed}"
    )
    rows = [
        [
            f"torch {name}",
            "yes" if verdict["loads"] else "no",
            "yes" if verdict["after_backport"] else "no",
            verdict["reason"],
        ]
        for name, verdict in found["verdicts"].items()
    ]
    oldest = found["oldest_runtime"] or found["oldest_after_backport"]
    if found["oldest_runtime"]:
        tail = f"oldest reference runtime that loads it: torch {oldest} ({found['oldest_role']})"
    elif oldest:
        tail = f"oldest reference runtime that loads it: torch {oldest}, after backport_for"
    else:
        tail = "no reference runtime loads it"
    checked = found["operators_checked"]
    tail += (
        f"; operators checked against torch {', '.join(checked)}"
        if checked
        else "; from the bytecode and operator versions (fxmobile check loads it in them)"
    )
    return head, rows, tail


def compatibility_table(found: Mapping[str, Any], tablefmt: str = "simple") -> str:
    """``FileCompatibility.to_dict()`` for people: versions, the operators whose meaning
    changed, a verdict per reference runtime (tabulate's ``tablefmt``) and the oldest one."""
    head, rows, tail = compatibility_parts(found)
    verdicts = tabulate(
        rows,
        headers=COMPATIBILITY_HEADERS,
        tablefmt=tablefmt,
        maxcolwidths=[None, None, None, 60],
    )
    return "\n".join([textwrap.fill(head, width=100), verdicts, textwrap.fill(tail, width=100)])
