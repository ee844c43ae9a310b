"""``report.to_dataframe()``: the report's tables as pandas DataFrames, missing values where a
figure does not apply, and a clear error without pandas."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile.errors import InvalidValueError, MissingDependencyError
from fxmobile.report import OutputCheck, PassRecord, PortableOp, ProgramFacts, Report, Stage, Status
from fxmobile.timing import summarize

pd = pytest.importorskip("pandas")


def test_one_row_per_pass_record_with_its_figures() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout()).eval()
    report = fxmobile.optimize_fx(
        model, torch.randn(1, 3, 8, 8), blocklist={fxmobile.MobileOptimizerType.FOLD_CONSTANTS}
    ).report
    frame = report.to_dataframe()
    assert list(frame.columns) == [
        "stage",
        "name",
        "member",
        "status",
        "step",
        "rewrites",
        "skipped",
        "nodes_before",
        "nodes_after",
        "param_bytes_before",
        "param_bytes_after",
        "seconds",
        "skips",
    ]
    assert list(frame["name"]) == [r.name for r in report.passes]
    fold = frame[frame["name"] == "fold_batchnorm"].iloc[0]
    record = report.record("fold_batchnorm")
    assert (fold["rewrites"], fold["nodes_before"], fold["nodes_after"]) == (1, 2, 1)
    assert fold["param_bytes_after"] == record.param_bytes_after
    assert fold["seconds"] == record.seconds
    blocked = frame[frame["status"] == "blocklisted"].iloc[0]
    assert blocked["name"] == "fold_constants"
    assert pd.isna(blocked["seconds"]) and pd.isna(blocked["nodes_after"])  # not 0: it never ran
    assert frame.groupby("stage")["rewrites"].sum()["fx"] == report.rewrites


def test_steps_have_no_rewrites_or_parameter_bytes() -> None:
    step = PassRecord(
        "torch.export",
        Stage.EXPORT,
        Status.RAN,
        nodes_before=6,
        nodes_after=6,
        seconds=1.5,
        step=True,
    )
    row = Report(model_name="Net", passes=[step]).to_dataframe().iloc[0]
    assert bool(row["step"]) and row["nodes_after"] == 6 and row["seconds"] == 1.5
    for column in ("rewrites", "skipped", "param_bytes_before", "param_bytes_after"):
        assert pd.isna(row[column]), column


def test_numerics_latency_and_portable_ops_tables() -> None:
    report = Report(
        model_name="Net",
        numerics=[OutputCheck(0, "out", 2e-7, 1.0, 1e-4)],
        latency={"eager": summarize([3.0, 1.0]), "lite interpreter": summarize([0.5])},
        program=ProgramFacts(100, 1, 4, (PortableOp("aten.cumsum", 2, "no kernel"),)),
    )
    numerics = report.to_dataframe("numerics")
    assert numerics.iloc[0]["path"] == "out" and bool(numerics.iloc[0]["passed"])
    latency = report.to_dataframe("latency")
    assert latency.values.tolist() == [
        ["eager", 0, 3.0],
        ["eager", 1, 1.0],
        ["lite interpreter", 0, 0.5],
    ]
    portable = report.to_dataframe("portable_ops")
    assert portable.values.tolist() == [["aten.cumsum", 2, "no kernel"]]
    empty = Report(model_name="Net")
    assert [len(empty.to_dataframe(t)) for t in ("passes", "numerics", "latency")] == [0, 0, 0]


def test_an_unknown_table_is_refused_with_the_names() -> None:
    with pytest.raises(InvalidValueError, match="passes, numerics, latency, portable_ops"):
        Report(model_name="Net").to_dataframe("pass")  # type: ignore[arg-type]


def test_without_pandas_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(MissingDependencyError, match=r"pip install pandas"):
        Report(model_name="Net").to_dataframe()
