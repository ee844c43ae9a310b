"""What a notebook shows: results and reports as HTML (summary first, details folded), short
reprs, the latency table, and steps that are not passes shown without parameter figures."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html.parser import HTMLParser

import torch
from torch import nn

import fxmobile
from fxmobile.report import (
    HookRecord,
    OutputCheck,
    PassRecord,
    PortableOp,
    ProgramFacts,
    Report,
    Stage,
    Status,
)
from fxmobile.timing import summarize


@dataclass
class Node:
    tag: str
    attrs: dict[str, str | None]
    children: list[Node | str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def find(self, tag: str) -> list[Node]:
        found = []
        for c in self.children:
            if isinstance(c, Node):
                found += [c] if c.tag == tag else []
                found += c.find(tag)
        return found

    def elements(self) -> list[Node]:
        return [c for c in self.children if isinstance(c, Node)]


class _Tree(HTMLParser):
    """The page as nested nodes; an end tag that does not close the open element fails."""

    def __init__(self) -> None:
        super().__init__()
        self.stack = [Node("root", {})]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs))
        self.stack[-1].children.append(node)
        self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(page: str) -> Node:
    tree = _Tree()
    tree.feed(page)
    tree.close()
    assert len(tree.stack) == 1, f"unclosed: {[n.tag for n in tree.stack[1:]]}"
    (top,) = tree.stack[0].elements()
    return top


def summary_rows(top: Node) -> dict[str, Node]:
    (table,) = [t for t in top.elements() if t.tag == "table"]
    return {row.find("th")[0].text(): row.find("td")[0] for row in table.find("tr")}


def folds(top: Node) -> dict[str, Node]:
    """Each ``<details>`` by the first word(s) of its label, up to a colon or parenthesis."""
    found = {}
    for d in top.find("details"):
        label = d.find("summary")[0].text()
        found[label.split(":")[0].split(" (")[0]] = d
    return found


def cells(table: Node) -> list[list[str]]:
    return [[c.text() for c in row.elements()] for row in table.find("tr")]


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.relu(self.bn(self.conv(x))))


def test_a_results_html_shows_the_summary_first_and_folds_each_table() -> None:
    result = fxmobile.optimize(SmallNet().eval(), example_inputs=torch.randn(1, 3, 8, 8))
    report = result.report
    top = parse(result._repr_html_())
    first = top.elements()
    assert [e.tag for e in first[:3]] == ["style", "div", "table"]  # title, then the summary
    assert all(e.tag == "details" for e in first[3:])
    assert first[1].text() == "fxmobile MobileResult: SmallNet for CPU"
    rows = summary_rows(top)
    assert list(rows) == [
        ".module",
        ".save(path)",
        "route",
        "rewrites",
        "ops left",
        "numerics",
        "size",
        "time",
    ]
    assert rows["route"].text() == "torch.fx"
    ran = [r for r in report.passes if r.status is Status.RAN]
    assert rows["rewrites"].text() == (
        f"{report.rewrites} rewrites by {sum(1 for r in ran if r.rewrites)} of {len(ran)} passes"
    )
    checks = report.numerics or []
    worst = max(c.relative_error for c in checks)
    expected = f"ok: worst relative error {worst:.2g} in {len(checks)} output check"
    assert rows["numerics"].text().startswith(expected)
    assert rows["numerics"].attrs["class"] == "ok"
    assert report.file_bytes is not None
    assert rows["size"].text() == f"lite-interpreter file {report.file_bytes / 1024:.1f} KiB"
    sections = folds(top)
    notes = ["notes"] if report.notes else []
    assert list(sections) == [
        "passes",
        "skipped rewrites",
        "numerics against eager",
        "operators before → after",
        "lints",
        "compatibility",
        *notes,
    ]
    assert all("open" not in d.attrs for d in sections.values())
    table = cells(sections["passes"].find("table")[0])
    headers = ["stage", "pass", "blocklist member", "rewrites", "nodes", "params", "ms"]
    assert table[0] == [*headers, "skipped"]
    assert [row[1] for row in table[1:]] == [r.name for r in report.passes]
    fold = next(r for r in report.passes if r.name == "fold_batchnorm" and r.stage is Stage.FX)
    row = table[1:][report.passes.index(fold)]
    assert row[3:5] == ["1", f"{fold.nodes_before} → {fold.nodes_after}"]


def test_every_string_from_the_model_or_a_pass_is_escaped() -> None:
    name, reason, hook = "Net<script>alert(1)</script>", "weight <shared> & tied", "f<g>"
    report = Report(
        model_name=name,
        passes=[PassRecord("fold", Stage.FX, Status.RAN, skips={reason: 2})],
        hooks=[HookRecord("<m>", "forward hook", hook, "kept <with> its module")],
        lints=[{"name": "L<1>", "message": "<b>bold</b>"}],
        notes=["<i>a note</i>"],
        declined=["torch.fx: <bad>"],
        route="torch.jit.trace",
    )
    page = report._repr_html_()
    for raw in ("<script>", "<shared>", "<g>", "<b>bold", "<i>", "<bad>", "<m>", "<with>"):
        assert raw not in page
    top = parse(page)
    assert name in top.elements()[1].text()
    sections = folds(top)
    assert cells(sections["skipped rewrites"].find("table")[0])[1] == ["fx fold", reason, "2"]
    assert cells(sections["hooks"].find("table")[0])[1][2:] == [hook, "kept <with> its module"]
    assert cells(sections["lints"].find("table")[0])[1] == ["L<1>", "<b>bold</b>"]
    notes = [li.text() for li in sections["notes"].find("li")]
    assert notes == ["declined: torch.fx: <bad>", "<i>a note</i>"]


def test_a_mismatch_is_the_verdict_and_opens_the_numerics() -> None:
    checks = [
        OutputCheck(0, "out[0]", 1e-7, 1.0, 1e-4),
        OutputCheck(1, "out[1]", 0.5, 2.0, 1e-4),
    ]
    report = Report(model_name="Net", numerics=checks)
    top = parse(report._repr_html_())
    verdict = summary_rows(top)["numerics"]
    assert verdict.text() == "MISMATCH in 1 of 2 output checks: out[1] is off by 0.25 relative" + (
        " (tolerance 1e-04)"
    )
    assert verdict.attrs["class"] == "bad"
    numerics = folds(top)["numerics against eager"]
    assert "open" in numerics.attrs
    rows = numerics.find("tr")[1:]
    assert [r.attrs.get("class") for r in rows] == [None, "bad"]
    assert "numerics MISMATCH (worst relative error 0.25)" in repr(report)


def test_steps_that_are_not_passes_have_no_rewrite_or_parameter_cells() -> None:
    report = Report(
        model_name="Net",
        passes=[
            PassRecord(
                "fold_batchnorm",
                Stage.FX,
                Status.RAN,
                "CONV_BN_FUSION",
                1,
                {},
                7,
                6,
                1200,
                1100,
                0.01,
            ),
            PassRecord(
                "torch.export",
                Stage.EXPORT,
                Status.RAN,
                nodes_before=6,
                nodes_after=6,
                seconds=1.2,
                step=True,
            ),
        ],
    )
    text = str(report)
    export_line = next(line for line in text.splitlines() if line.startswith("export"))
    assert " B" not in export_line and "6 → 6" in export_line and "1200.0" in export_line
    assert "1.2 KiB → 1.1 KiB" in text
    table = cells(folds(parse(report._repr_html_()))["passes"].find("table")[0])
    assert table[2][3:7] == ["", "6 → 6", "", "1200.0"]
    assert table[1][3:6] == ["1", "7 → 6", "1.2 KiB → 1.1 KiB"]
    assert report.to_dict()["passes"][1]["step"] is True


def test_reprs_are_two_lines_at_most_and_measure_nothing() -> None:
    model, x = SmallNet().eval(), torch.randn(1, 3, 8, 8)
    fx_result = fxmobile.optimize_fx(model, x)
    mobile = fxmobile.optimize(model, example_inputs=x)
    nodes = len(fx_result.graph_module.graph.nodes)
    assert repr(fx_result).splitlines()[0] == f"FxResult: graph_module with {nodes} nodes"
    assert repr(mobile).splitlines()[0] == "MobileResult: module ScriptModule SmallNet"
    for shown in (repr(fx_result), repr(mobile), repr(mobile.report)):
        assert len(shown.splitlines()) <= 2 and len(shown) < 400, shown
        assert "tensor(" not in shown and "Parameter" not in shown
    assert mobile.report._file is None  # the file was not serialized to be shown
    line = repr(mobile.report)
    assert line.startswith("Report(SmallNet for CPU; route torch.fx; ")
    assert "numerics ok (worst relative error" in line and line.endswith(")")


def test_a_program_results_summary_names_its_delegate_calls_and_portable_ops() -> None:
    reason = "XNNPACK has no kernel <for> it"
    facts = ProgramFacts(4700, 1, 5, (PortableOp("aten.cumsum", 1, reason),))
    report = Report(
        model_name="Cumulative",
        backend="ExecuTorch (XNNPACK delegate)",
        passes=[
            PassRecord(
                "to_edge_transform_and_lower",
                Stage.LOWER,
                Status.RAN,
                nodes_before=6,
                nodes_after=3,
                seconds=2.0,
                step=True,
            ),
        ],
        program=facts,
    )
    result = fxmobile.ProgramResult(None, bytes(4700), report, runner=lambda *inputs: None)
    assert repr(result).splitlines() == [
        "ProgramResult: program of 4.6 KiB",
        "  report: Cumulative for ExecuTorch (XNNPACK delegate); 0 rewrites by 0 of 0 passes; "
        "1 op on portable kernels; numerics not checked; ExecuTorch program 4.6 KiB",
    ]
    top = parse(result._repr_html_())
    rows = summary_rows(top)
    assert list(rows)[:4] == [".program", ".buffer", ".save(path)", ".run(*inputs)"]
    assert rows["ops left"].text() == "1 on portable kernels (aten.cumsum 1)"
    assert rows["delegate"].text() == "1 XNNPACK delegate call holding 5 ops"
    assert rows["size"].text() == "ExecuTorch program 4.6 KiB"
    portable = folds(top)["portable ops"]
    assert cells(portable.find("table")[0])[1] == ["aten.cumsum", "1", reason]


def test_latency_shows_in_the_text_the_html_and_a_compact_dict() -> None:
    report = Report(
        model_name="Net",
        latency={
            "eager": summarize([3.0, 1.0, 2.0, 4.0, 5.0]),
            "lite interpreter": summarize([1.0, 1.5, 0.5]),
        },
    )
    text = str(report)
    assert (
        "latency, ms per call:\ncandidate           median ms    p10 ms    p90 ms    runs" in text
    )
    assert "eager                    3.00      1.00      5.00       5" in text
    rows = summary_rows(parse(report._repr_html_()))
    assert rows["latency"].text() == "eager 3.00 ms, lite interpreter 1.00 ms (medians)"
    table = cells(folds(parse(report._repr_html_()))["latency"].find("table")[0])
    assert table[2] == ["lite interpreter", "1.00", "0.50", "1.50", "3"]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["latency"]["eager"] == {"median_ms": 3.0, "p10_ms": 1.0, "p90_ms": 5.0, "runs": 5}
    assert report.latency is not None
    assert report.latency["eager"].samples_ms == (3.0, 1.0, 2.0, 4.0, 5.0)  # in measured order
