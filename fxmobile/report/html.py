"""The report, and the results that carry one, as HTML for a notebook (``_repr_html_``).

A summary comes first (``fxmobile.report.summary``: route, rewrites, ops left, the numerical
verdict, size, time, delegate calls, latency); every table follows folded in ``<details>``, with
the same rows as the text tables (``fxmobile.report.render``). Every string that reaches the
page is escaped: model names, skip reasons, hook names and lint messages can hold ``<`` and
``&``. Only the standard library is used; the small stylesheet is scoped to the ``fxm`` class
and inherits the notebook's colours, so light and dark themes both read.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from fxmobile.report import render, summary
from fxmobile.report.records import Report, Status

STYLE = """<style>
.fxm {font-size: 13px; line-height: 1.45; max-width: 1100px}
.fxm table {border-collapse: collapse; margin: 4px 0 8px 0; width: auto}
.fxm th, .fxm td {padding: 2px 10px 2px 0; text-align: left; vertical-align: top;
  border-bottom: 1px solid rgba(127, 127, 127, 0.25); white-space: normal}
.fxm th {font-weight: 600}
.fxm td.num, .fxm th.num {text-align: right; font-variant-numeric: tabular-nums}
.fxm .summary th {width: 7em; border: none; opacity: 0.75; font-weight: 500}
.fxm .summary td {border: none}
.fxm .ok {color: #1a7f37} .fxm .bad {color: #d1242f; font-weight: 600}
.fxm .muted {opacity: 0.55} .fxm .step {font-style: italic}
.fxm details {margin: 1px 0} .fxm summary {cursor: pointer; padding: 1px 0}
.fxm .title {font-size: 14px; margin-bottom: 2px}
</style>"""

# Columns that hold numbers, right-aligned (indexes into each table's headers).
_PASS_NUMERIC = {3, 4, 5, 6, 7}


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    numeric: frozenset[int] | set[int] = frozenset(),
    row_classes: Sequence[str] | None = None,
) -> str:
    """An HTML table of escaped cells; the ``numeric`` columns are right-aligned."""

    def cell(tag: str, i: int, text: str) -> str:
        align = ' class="num"' if i in numeric else ""
        return f"<{tag}{align}>{escape(text)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = []
    for r, row in enumerate(rows):
        css = row_classes[r] if row_classes else ""
        attr = f' class="{css}"' if css else ""
        body.append(f"<tr{attr}>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def fold(label: str, body: str, is_open: bool = False) -> str:
    """``body`` under a ``<details>`` whose summary reads ``label`` (escaped)."""
    attr = " open" if is_open else ""
    return f"<details{attr}><summary>{escape(label)}</summary>{body}</details>"


def _paragraphs(lines: Sequence[str]) -> str:
    return "".join(f"<div>{escape(line)}</div>" for line in lines)


def _pass_section(report: Report) -> str:
    rows, classes = [], []
    for rec in report.passes:
        skipped = sum(rec.skips.values())
        rows.append([*render.pass_cells(rec), str(skipped) if skipped else ""])
        if rec.status is Status.BLOCKLISTED:
            classes.append("muted")
        else:
            classes.append("step" if rec.step else "")
    label = f"passes: {summary.rewrites(report)}"
    steps = sum(1 for r in report.passes if r.step)
    if steps:
        label += f"; {steps} export and lowering step(s)"
    headers = [*render.PASS_HEADERS, "skipped"]
    return fold(label, table(headers, rows, _PASS_NUMERIC, classes))


def _skip_section(report: Report) -> str:
    rows = [
        [f"{rec.stage.value} {rec.name}", reason, str(count)]
        for rec in report.passes
        for reason, count in rec.skips.items()
    ]
    if not rows:
        return ""
    total = sum(int(r[2]) for r in rows)
    label = f"skipped rewrites: {total}, for {len(rows)} reason(s)"
    return fold(label, table(["pass", "why it declined", "times"], rows, {2}))


def _numerics_section(report: Report) -> str:
    if report.numerics is None:
        return ""
    passed, _ = summary.verdict(report)
    rows = render.numerics_rows(report.numerics)
    classes = ["" if c.passed else "bad" for c in report.numerics]
    body = table(render.NUMERICS_HEADERS, rows, {1, 2, 3, 4}, classes)
    label = f"numerics against eager ({len(rows)} output check(s))"
    return fold(label, body, is_open=passed is False)


def _latency_section(report: Report) -> str:
    if not report.latency:
        return ""
    rows = render.latency_rows(report.latency)
    body = table(render.LATENCY_HEADERS, rows, {1, 2, 3, 4})
    return fold(f"latency ({len(rows)} candidates, ms per call)", body)


def _hooks_section(report: Report) -> str:
    if not report.hooks:
        return ""
    body = table(render.HOOK_HEADERS, render.hook_rows(report))
    return fold(f"hooks ({len(report.hooks)})", body)


def _ops_section(report: Report) -> str:
    if report.ops_after is None:
        return ""
    rows = render.ops_rows(report)
    body = table(render.OPS_HEADERS, rows, {1, 2})
    if report.unfused_ops is not None:
        body += _paragraphs([render.unfused_line(report.unfused_ops)])
    return fold(f"operators before → after ({len(rows)} kinds)", body)


def _lints_section(report: Report) -> str:
    if not report.lints:
        return ""
    rows = [[lint["name"], lint["message"]] for lint in report.lints]
    return fold(f"lints ({len(rows)})", table(["lint", "message"], rows))


def _compatibility_section(report: Report) -> str:
    found = report.compatibility
    if found is None:
        return ""
    head, rows, tail = render.compatibility_parts(found)
    body = _paragraphs([head]) + table(render.COMPATIBILITY_HEADERS, rows) + _paragraphs([tail])
    oldest = found["oldest_runtime"] or found["oldest_after_backport"]
    label = f"compatibility: loads in torch {oldest} and later" if oldest else "compatibility"
    return fold(label, body)


def _portable_section(report: Report) -> str:
    program = report.program
    if program is None or not program.portable_ops:
        return ""
    rows = render.portable_rows(program)
    body = _paragraphs([render.program_head(program)])
    body += table(render.PORTABLE_HEADERS, rows, {1})
    return fold(f"portable ops ({program.portable_count} op call(s))", body)


def _notes_section(report: Report) -> str:
    lines = [f"declined: {why}" for why in report.declined]
    if report.parametrizations:
        baked = ", ".join(f"{kind} {n}" for kind, n in sorted(report.parametrizations.items()))
        lines.append(f"parametrizations evaluated into plain parameters: {baked}")
    lines += report.notes
    if not lines:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    return fold(f"notes ({len(lines)})", f"<ul>{items}</ul>")


def _summary_table(report: Report, holds: Sequence[tuple[str, str]]) -> str:
    passed, _ = summary.verdict(report)
    rows = []
    for name, text in holds:
        rows.append(f"<tr><th>.{escape(name)}</th><td>{escape(text)}</td></tr>")
    for label, text in summary.facts(report):
        css = ""
        if label == "numerics" and passed is not None:
            css = ' class="ok"' if passed else ' class="bad"'
        rows.append(f"<tr><th>{escape(label)}</th><td{css}>{escape(text)}</td></tr>")
    return f'<table class="summary"><tbody>{"".join(rows)}</tbody></table>'


def report_html(report: Report, kind: str = "report", holds: Sequence[tuple[str, str]] = ()) -> str:
    """The report as HTML: the summary, then each table folded. ``kind`` names what is shown
    (``"MobileResult"``), ``holds`` its attributes as (name, what it is) pairs."""
    sections = [
        _pass_section(report),
        _skip_section(report),
        _numerics_section(report),
        _latency_section(report),
        _hooks_section(report),
        _ops_section(report),
        _lints_section(report),
        _compatibility_section(report),
        _portable_section(report),
        _notes_section(report),
    ]
    title = escape(f"fxmobile {kind}: {summary.title(report)}")
    head = f'<div class="title"><b>{title}</b></div>{_summary_table(report, holds)}'
    return f'<div class="fxm">{STYLE}{head}{"".join(sections)}</div>'
