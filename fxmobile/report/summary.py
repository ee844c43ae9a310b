"""The report in brief: the facts a notebook shows first, and the reprs' one line.

Each fact is one short sentence built from the records (never from the rendered tables): the
route, the rewrites, the ops left outside packed kernels or the delegate, the numerical verdict
with the worst relative error, the size, the time, the delegate calls and the latency.
"""

from __future__ import annotations

from fxmobile.report.records import PassRecord, Report, Status
from fxmobile.report.render import format_bytes, ranked


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def passes_of(report: Report) -> list[PassRecord]:
    """The records of passes (not of steps such as torch.export) that ran."""
    return [r for r in report.passes if r.status is Status.RAN and not r.step]


def rewrites(report: Report) -> str:
    """``"204 rewrites by 8 of 27 passes, 1 blocklisted"``."""
    ran = passes_of(report)
    changed = sum(1 for r in ran if r.rewrites)
    passes = _plural(len(ran), "pass", "passes")
    text = f"{_plural(report.rewrites, 'rewrite')} by {changed} of {passes}"
    blocked = sum(1 for r in report.passes if r.status is Status.BLOCKLISTED)
    return text + (f", {blocked} blocklisted" if blocked else "")


def verdict(report: Report) -> tuple[bool | None, str]:
    """Whether the outputs matched eager (None: not checked), and the verdict in words."""
    checks = report.numerics
    if checks is None:
        return None, "not checked" + (" (see the notes)" if report.notes else "")
    if not checks:
        return True, "no tensor outputs to compare"
    worst = max(checks, key=lambda c: c.relative_error)
    failed = [c for c in checks if not c.passed]
    outputs = _plural(len(checks), "output check")
    if not failed:
        return True, (
            f"ok: worst relative error {worst.relative_error:.2g} in {outputs} "
            f"(tolerance {worst.tolerance:.0e})"
        )
    return False, (
        f"MISMATCH in {len(failed)} of {outputs}: {worst.path} is off by "
        f"{worst.relative_error:.2g} relative (tolerance {worst.tolerance:.0e})"
    )


def ops_left(report: Report) -> str | None:
    """The ops a mobile runtime dispatches one by one, or an ExecuTorch program runs on
    portable kernels; None when the report does not know."""
    if report.program is not None:
        program = report.program
        if not program.portable_ops:
            return "0 on portable kernels: every op runs in the XNNPACK delegate"
        counts = {p.op: p.count for p in program.portable_ops}
        return f"{program.portable_count} on portable kernels ({ranked(counts, 4)})"
    if report.unfused_ops is None:
        return None
    total = sum(report.unfused_ops.values())
    if not total:
        return "0 unfused: every tensor op runs in a packed kernel"
    return f"{total} unfused ({ranked(report.unfused_ops, 4)})"


def size(report: Report, measure: bool = True) -> str | None:
    """The program's or the lite-interpreter file's size; ``measure=False`` reads only a size
    already known (measuring the file serializes the module)."""
    if report.program is not None:
        return f"ExecuTorch program {format_bytes(report.program.nbytes)}"
    known = report.file if measure else report._file
    return None if known is None else f"lite-interpreter file {format_bytes(known.nbytes)}"


def delegated(report: Report) -> str | None:
    """``"1 XNNPACK delegate call holding 5 ops"`` for an ExecuTorch program."""
    if report.program is None:
        return None
    program = report.program
    calls = _plural(program.delegate_calls, "XNNPACK delegate call")
    return f"{calls} holding {_plural(program.delegated_ops, 'op')}"


def seconds(report: Report) -> str | None:
    """``"optimized in 2.1 s, checked in 0.4 s"``."""
    parts = []
    if report.optimize_seconds is not None:
        parts.append(f"optimized in {report.optimize_seconds:.1f} s")
    if report.check_seconds is not None:
        parts.append(f"checked in {report.check_seconds:.1f} s")
    return ", ".join(parts) or None


def latency(report: Report) -> str | None:
    """Each candidate's median: ``"eager 20.9 ms, lite interpreter 10.0 ms (medians)"``."""
    if not report.latency:
        return None
    medians = ", ".join(f"{name} {t.median_ms:.2f} ms" for name, t in report.latency.items())
    return f"{medians} (medians)"


def route(report: Report) -> str | None:
    """The capture route, and how many were declined before it."""
    if report.route is None:
        return None
    declined = f" ({_plural(len(report.declined), 'route')} declined)" if report.declined else ""
    return report.route + declined


def facts(report: Report) -> list[tuple[str, str]]:
    """The summary, as (label, sentence) pairs in the order a notebook shows them."""
    found = [
        ("route", route(report)),
        ("rewrites", rewrites(report)),
        ("ops left", ops_left(report)),
        ("numerics", verdict(report)[1]),
        ("size", size(report)),
        ("delegate", delegated(report)),
        ("time", seconds(report)),
        ("latency", latency(report)),
    ]
    return [(label, text) for label, text in found if text is not None]


def title(report: Report) -> str:
    """``"MobileNetV2 for CPU"``."""
    return report.model_name + (f" for {report.backend}" if report.backend else "")


def worst_relative_error(report: Report) -> float | None:
    """The largest relative error of any output against eager, if outputs were compared."""
    if not report.numerics:
        return None
    return max(c.relative_error for c in report.numerics)


def one_line(report: Report) -> str:
    """The report in one line, without measuring anything: what ``repr`` shows."""
    parts = [title(report)]
    if report.route:
        parts.append(f"route {report.route}")
    parts.append(rewrites(report))
    if report.program is not None:
        parts.append(f"{_plural(report.program.portable_count, 'op')} on portable kernels")
    elif report.unfused_ops is not None:
        parts.append(f"{_plural(sum(report.unfused_ops.values()), 'op')} unfused")
    passed, _ = verdict(report)
    worst = worst_relative_error(report)
    if passed is None:
        parts.append("numerics not checked")
    elif worst is None:
        parts.append("no tensor outputs to compare")
    else:
        word = "ok" if passed else "MISMATCH"
        parts.append(f"numerics {word} (worst relative error {worst:.2g})")
    known = size(report, measure=False)
    if known:
        parts.append(known)
    return "; ".join(parts)
