"""Blocklist normalization, the pass manager's records, and the report's renderings."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch import fx, nn

import fxmobile
from fxmobile import MobileOptimizerType
from fxmobile.infra import PassResult
from fxmobile.options import normalize_blocklist
from fxmobile.passes.stage import FxContext, FxPass
from fxmobile.report import Stage, Status
from tests.helpers import run_fx_passes


def test_upstream_members_map_by_name() -> None:
    # torch's stub declares _MobileOptimizerType without its members (a pybind11 enum at run time)
    upstream = torch._C._MobileOptimizerType
    dropout = upstream.REMOVE_DROPOUT  # type: ignore[attr-defined]
    got = normalize_blocklist([dropout, MobileOptimizerType.REMOVE_IDENTITY])
    assert got == {MobileOptimizerType.REMOVE_DROPOUT, MobileOptimizerType.REMOVE_IDENTITY}
    assert set(upstream.__members__) <= set(MobileOptimizerType.__members__)  # type: ignore[attr-defined]


def test_string_in_blocklist_is_refused_with_the_member_to_use() -> None:
    with pytest.raises(fxmobile.InvalidArgumentError, match=r"MobileOptimizerType\.REMOVE_DROPOUT"):
        normalize_blocklist(["remove_dropout"])  # type: ignore[list-item]


def test_single_member_instead_of_a_set_is_refused() -> None:
    with pytest.raises(fxmobile.InvalidArgumentError, match="wrap it"):
        normalize_blocklist(MobileOptimizerType.REMOVE_DROPOUT)  # type: ignore[arg-type]


def test_blocklisted_pass_does_not_run_and_is_recorded() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout()).eval()
    result = fxmobile.optimize_fx(
        model,
        torch.randn(2, 3),
        # torch's stub declares _MobileOptimizerType without its members
        blocklist={torch._C._MobileOptimizerType.REMOVE_DROPOUT},  # type: ignore[attr-defined]
    )
    assert result.report.record("remove_dropout").status is Status.BLOCKLISTED
    assert any(type(m) is nn.Dropout for m in result.graph_module.modules())


def test_every_entry_point_spells_the_blocklist_blocklist() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout()).eval()
    blocked = {MobileOptimizerType.REMOVE_DROPOUT}
    fx_result = fxmobile.optimize_fx(model, blocklist=blocked)
    mobile = fxmobile.optimize(model, blocklist=blocked)
    for report in (fx_result.report, mobile.report):
        assert report.record("remove_dropout").status is Status.BLOCKLISTED


def test_optimize_names_blocklist_when_given_upstreams_spelling() -> None:
    model = nn.Linear(3, 3).eval()
    with pytest.raises(fxmobile.InvalidArgumentError, match=r"'optimization_blocklist'.*blocklist"):
        fxmobile.optimize(model, optimization_blocklist=set())  # type: ignore[call-overload]
    with pytest.raises(fxmobile.InvalidArgumentError, match=r"'tolerence'.*tolerance="):
        fxmobile.optimize_fx(model, tolerence=1e-3)  # type: ignore[call-arg]


def test_the_drop_in_takes_upstreams_blocklist_positionally_and_by_its_keyword() -> None:
    scripted = torch.jit.script(nn.Sequential(nn.Linear(3, 3), nn.ReLU()).eval())
    blocked = {torch._C._MobileOptimizerType.INSERT_FOLD_PREPACK_OPS}  # type: ignore[attr-defined]
    for optimized in (
        fxmobile.optimize_for_mobile(scripted, blocked),
        fxmobile.optimize_for_mobile(scripted, optimization_blocklist=blocked),
        fxmobile.optimize_for_mobile(scripted, blocklist=blocked),
    ):
        assert "prepacked::linear_clamp_run" not in str(optimized.graph)
    assert "prepacked::linear_clamp_run" in str(fxmobile.optimize_for_mobile(scripted).graph)
    with pytest.raises(fxmobile.InvalidArgumentError, match="pass one"):
        fxmobile.optimize_for_mobile(scripted, blocked, optimization_blocklist=blocked)


class Broken(FxPass):
    optimization = MobileOptimizerType.FOLD_CONSTANTS
    summary = "breaks"

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        raise RuntimeError("boom")


def test_failing_pass_names_itself_and_the_passes_before_it() -> None:
    from fxmobile.passes.remove_dropout import RemoveDropout

    gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(
        fxmobile.PassError,
        match=r"fx pass .test_options_and_report. failed.*boom.*ran before it: remove_dropout\. "
        r"Blocklist MobileOptimizerType\.FOLD_CONSTANTS",
    ):
        run_fx_passes(gm, [RemoveDropout(), Broken()])


def test_report_renders_as_table_markdown_and_json() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Identity(), nn.Dropout()).eval()
    report = fxmobile.optimize_fx(model, torch.randn(2, 3)).report
    text = str(report)
    assert "remove_dropout" in text and "remove_identity" in text and "ok" in text
    md = report.to_markdown()
    assert md.count("|---") >= 2 or "|----" in md
    data = json.loads(json.dumps(report.to_dict()))
    rec = next(p for p in data["passes"] if p["name"] == "remove_dropout")
    assert rec["rewrites"] == 1 and rec["nodes_before"] == rec["nodes_after"] + 1
    assert data["numerics"][0]["passed"] is True
    assert report._repr_markdown_() == md


def test_numerics_report_flags_a_mismatch() -> None:
    from fxmobile.verify import compare_outputs

    ref = (torch.ones(3), {"b": torch.full((2,), 10.0)})
    act = (torch.ones(3), {"b": torch.full((2,), 10.1)})
    checks = compare_outputs(ref, act, tolerance=1e-3)
    assert [c.passed for c in checks] == [True, False]
    assert checks[1].path == "[1]['b']" and checks[1].relative_error == pytest.approx(
        0.01, rel=1e-4
    )


def test_example_inputs_that_do_not_fit_are_refused() -> None:
    with pytest.raises(fxmobile.InvalidValueError, match=r"example_inputs do not run.*\(2, 5\)"):
        fxmobile.optimize_fx(nn.Linear(3, 3).eval(), torch.randn(2, 5))


class _ConvReluAdd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)) + x


def test_report_counts_the_ops_left_outside_packed_kernels() -> None:
    model = _ConvReluAdd().eval()
    x = torch.randn(1, 3, 8, 8)
    report = fxmobile.optimize(model, example_inputs=x, channels_last=False).report
    assert report.unfused_ops == {"aten::add": 1}  # conv and relu run as one prepacked op
    assert "ops left unfused: 1 (aten::add 1)" in str(report)
    assert report.to_dict()["unfused_ops"] == {"aten::add": 1}

    kept = fxmobile.optimize(
        model,
        {MobileOptimizerType.INSERT_FOLD_PREPACK_OPS},
        example_inputs=torch.randn(1, 3, 8, 8),
    ).report
    assert kept.unfused_ops is not None
    assert kept.unfused_ops.get("aten::conv2d") == 1

    # the CPU default runs channels-last: one layout change in, one back to eager's layout out
    default = fxmobile.optimize(model, example_inputs=x).report
    assert default.unfused_ops == {"aten::add": 1, "aten::contiguous": 2}


def test_interleaved_medians_runs_every_candidate_each_round() -> None:
    from fxmobile.timing import interleaved_medians

    calls = {"a": 0, "b": 0}

    def bump(name: str) -> None:
        calls[name] += 1

    timings = interleaved_medians(
        {"a": lambda: bump("a"), "b": lambda: bump("b")}, rounds=7, warmup=1
    )
    assert calls == {"a": 8, "b": 8}
    assert {t.runs for t in timings.values()} == {7}
    assert all(t.p10_ms <= t.median_ms <= t.p90_ms for t in timings.values())
    with pytest.raises(ValueError, match="at least 1"):
        interleaved_medians({"a": lambda: None}, rounds=0)


def test_file_size_is_measured_when_read_or_saved(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    model = _ConvReluAdd().eval()
    x = torch.randn(1, 3, 8, 8)
    measured = fxmobile.optimize(model, example_inputs=x).report.file_bytes
    result = fxmobile.optimize(model, example_inputs=x)
    path = tmp_path / "m.ptl"
    result.save(path)  # no serialization happened before: the saved file gives the size
    assert result.report.file_bytes == path.stat().st_size
    assert result.report.to_dict()["file_bytes"] == path.stat().st_size
    # the archive's folder is named after the file, so sizes differ by a few bytes per entry
    assert measured is not None and abs(measured - path.stat().st_size) < 1024


class _DropoutPlusZero(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.drop = nn.Dropout()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc(x)) + 0


def _cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def _pass_table(text: str) -> str:
    """The pass table: the block after the title and the route (when the report has one)."""
    blocks = text.split("\n\n")
    return blocks[2] if blocks[1].startswith("route: ") else blocks[1]


def _pass_rows(text: str) -> dict[str, list[str]]:
    """The pass table's rows by pass name: the lines between the dashes and the first blank."""
    lines = _pass_table(text).splitlines()
    assert set(lines[1]) <= {"-", " "}
    return {_cells(line)[1]: _cells(line) for line in lines[2:]}


def test_text_table_has_its_columns_in_order_with_each_records_values() -> None:
    blocklist = {MobileOptimizerType.FOLD_CONSTANTS}
    report = fxmobile.optimize_fx(_DropoutPlusZero().eval(), blocklist=blocklist).report
    text = str(report)
    assert text.split("\n\n")[:2] == ["fxmobile report: _DropoutPlusZero", "route: torch.fx"]
    assert _cells(_pass_table(text).splitlines()[0]) == [
        "stage",
        "pass",
        "blocklist member",
        "rewrites",
        "nodes",
        "params",
        "ms",
        "skipped (reason ×count)",
    ]
    rows = _pass_rows(text)
    names = [_cells(line)[1] for line in _pass_table(text).splitlines()[2:]]
    assert names == [r.name for r in report.passes]  # dead code twice: before and after folds
    dropout, identity = rows["remove_dropout"], rows["remove_identity"]
    # 48 B: the Linear's 12 float32 parameters; the dropout module's node went
    assert dropout[:6] == ["fx", "remove_dropout", "REMOVE_DROPOUT", "1", "3 → 2", "48 B → 48 B"]
    assert len(dropout) == 7  # nothing skipped
    assert identity[:6] == ["fx", "remove_identity", "REMOVE_IDENTITY", "0", "2 → 2", "48 B → 48 B"]
    assert identity[7:] == ["input dtype unknown (pass example_inputs) ×1"]
    for name, row in (("remove_dropout", dropout), ("remove_identity", identity)):
        ms = report.record(name).seconds * 1000
        assert float(row[6]) == pytest.approx(ms, abs=0.051)
    assert rows["fold_constants"] == ["fx", "fold_constants", "FOLD_CONSTANTS", "blocklisted"]


class _WithExport(_DropoutPlusZero):
    @torch.jit.export
    def twice(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * 2


def test_preserved_methods_skip_the_fx_stage_and_the_report_says_so() -> None:
    model = _WithExport().eval()
    x = torch.randn(2, 3)
    result = fxmobile.optimize(model, preserved_methods=["twice"], example_inputs=x)
    note = (
        "FX stage skipped: torch.fx traces forward only, and preserved methods need the "
        "scripted original"
    )
    assert result.report.notes == [note]
    assert {r.stage for r in result.report.passes} == {Stage.SCRIPT}
    text = str(result.report)
    assert text.endswith(f"note: {note}")
    rows = _pass_rows(text)
    assert rows["freeze"][:3] == ["script", "freeze", "—"]  # no member switches it off
    assert rows["fold_prepacking"][:4] == [
        "script",
        "fold_prepacking",
        "INSERT_FOLD_PREPACK_OPS",
        "2",
    ]
    torch.testing.assert_close(result.module.twice(x), model.twice(x))
    # the same model without preserved methods goes through the FX stage, without the note
    plain = fxmobile.optimize(model, example_inputs=x).report
    assert Stage.FX in {r.stage for r in plain.passes} and note not in plain.notes
