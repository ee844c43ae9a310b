"""Render a ``Report`` as text tables (terminal or Markdown) with tabulate."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from tabulate import tabulate

from fxmobile.report.records import OutputCheck, PassRecord, ProgramFacts, Report, Status


def format_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``: bytes in the largest unit that keeps the number under 1024."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def _skips(rec: PassRecord) -> str:
    return "; ".join(f"{reason} ×{count}" for reason, count in rec.skips.items())


def _pass_rows(report: Report) -> list[list[object]]:
    rows: list[list[object]] = []
    for rec in report.passes:
        member = rec.member or "—"
        if rec.status is Status.BLOCKLISTED:
            rows.append([rec.stage.value, rec.name, member, "blocklisted", "", "", "", ""])
            continue
        rows.append(
            [
                rec.stage.value,
                rec.name,
                member,
                rec.rewrites,
                f"{rec.nodes_before} → {rec.nodes_after}",
                f"{format_bytes(rec.param_bytes_before)} → {format_bytes(rec.param_bytes_after)}",
                f"{rec.seconds * 1000:.1f}",
                _skips(rec),
            ]
        )
    return rows


def _ops_table(report: Report, fmt: str) -> str:
    before, after = report.ops_before or {}, report.ops_after or {}
    kinds = sorted(set(before) | set(after), key=lambda k: (-after.get(k, 0), k))
    rows = [[kind, before.get(kind, 0), after.get(kind, 0)] for kind in kinds]
    return tabulate(rows, headers=["operator", "before", "after"], tablefmt=fmt)


def render(report: Report, fmt: str) -> str:
    """The report as tables in tabulate format ``fmt`` ("simple" for terminals, "github")."""
    backend = f" for {report.backend}" if report.backend else ""
    parts = [f"fxmobile report: {report.model_name}{backend}"]
    if report.route:
        lines = [f"route: {report.route}"]
        lines += [f"  declined: {why}" for why in report.declined]
        parts.append("\n".join(lines))
    parts.append(
        tabulate(
            _pass_rows(report),
            headers=[
                "stage",
                "pass",
                "blocklist member",
                "rewrites",
                "nodes",
                "params",
                "ms",
                "skipped (reason ×count)",
            ],
            tablefmt=fmt,
        )
    )
    if report.hooks:
        rows = [[h.module or "<model>", h.kind, h.hook, h.action] for h in report.hooks]
        headers = ["hooked module", "hook", "function", "what fxmobile did"]
        parts.append(
            tabulate(rows, headers=headers, tablefmt=fmt, maxcolwidths=[None, None, 30, 60])
        )
    if report.parametrizations:
        baked = ", ".join(f"{kind} {n}" for kind, n in sorted(report.parametrizations.items()))
        parts.append(f"parametrizations evaluated into plain parameters: {baked}")
    if report.numerics is not None:
        parts.append(numerics_table(report.numerics, fmt))
    if report.ops_after is not None:
        parts.append(_ops_table(report, fmt))
    if report.unfused_ops is not None:
        parts.append(_unfused_line(report.unfused_ops))
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


def _unfused_line(unfused: dict[str, int]) -> str:
    total = sum(unfused.values())
    if not total:
        return "ops left unfused: 0 (every tensor op runs in a packed kernel)"
    ranked = sorted(unfused.items(), key=lambda kv: (-kv[1], kv[0]))
    return f"ops left unfused: {total} (" + ", ".join(f"{k} {n}" for k, n in ranked) + ")"


def program_summary(program: ProgramFacts, fmt: str) -> str:
    """The ExecuTorch program: size, delegate calls, and each op left on portable kernels."""
    head = (
        f"ExecuTorch program: {format_bytes(program.nbytes)}, {program.delegate_calls} XNNPACK "
        f"delegate call(s) holding {program.delegated_ops} ops, "
        f"{program.portable_count} op call(s) on portable kernels"
    )
    if not program.portable_ops:
        return head
    rows = [[p.op, p.count, p.reason] for p in program.portable_ops]
    headers = ["portable op", "calls", "why XNNPACK did not take it"]
    return (
        head + "\n\n" + tabulate(rows, headers=headers, tablefmt=fmt, maxcolwidths=[None, None, 70])
    )


def numerics_table(checks: list[OutputCheck], fmt: str) -> str:
    """One row per checked output: its error against eager and whether it passed."""
    rows = [
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
    headers = ["output", "max abs err", "eager max abs", "relative", "tolerance", "check"]
    return tabulate(rows, headers=headers, tablefmt=fmt)


def compatibility_table(found: Mapping[str, Any], tablefmt: str = "simple") -> str:
    """``FileCompatibility.to_dict()`` for people: versions, the operators whose meaning
    changed, a verdict per reference runtime (tabulate's ``tablefmt``) and the oldest one."""
    changed = found["versioned_operators"]
    listed = ", ".join(f"{op['name']} {op['version']}" for op in changed) if changed else "none"
    head = textwrap.fill(
        f"mobile compatibility: bytecode {found['bytecode_version']}, operator version "
        f"{found['operator_version']}; operators whose meaning torch changed, and at which "
        f"operator version: {listed}",
        width=100,
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
    headers = ["reference runtime", "loads as saved", "after backport_for", "why"]
    verdicts = tabulate(
        rows, headers=headers, tablefmt=tablefmt, maxcolwidths=[None, None, None, 60]
    )
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
    return "\n".join([head, verdicts, textwrap.fill(tail, width=100)])
