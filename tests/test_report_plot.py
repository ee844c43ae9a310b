"""``report.plot()``: one bar per pass for its time, nodes and parameter bytes, the latency of
each candidate, and a clear error without matplotlib."""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.patches import Rectangle
from torch import nn

import fxmobile
from fxmobile.errors import InvalidValueError, MissingDependencyError
from fxmobile.report import PassRecord, Report, Stage, Status
from fxmobile.timing import interleaved_medians, summarize

matplotlib.use("Agg")


def bar_widths(ax: Axes) -> list[float]:
    return [p.get_width() for p in ax.patches if isinstance(p, Rectangle)]


def hand_made() -> Report:
    return Report(
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
                2048,
                1024,
                0.010,
            ),
            PassRecord("remove_dropout", Stage.FX, Status.BLOCKLISTED, "REMOVE_DROPOUT"),
            PassRecord(
                "torch.export",
                Stage.EXPORT,
                Status.RAN,
                nodes_before=6,
                nodes_after=9,
                seconds=1.5,
                step=True,
            ),
        ],
        latency={"eager": summarize([2.0, 3.0, 4.0]), "lite interpreter": summarize([1.0, 1.5])},
    )


def test_each_pass_is_a_row_of_its_time_nodes_and_parameters() -> None:
    fig = hand_made().plot()
    times, nodes, params, latency = fig.axes
    labels = [t.get_text() for t in times.get_yticklabels()]
    assert labels == ["fold_batchnorm", "remove_dropout (blocklisted)", "torch.export"]
    assert bar_widths(times) == pytest.approx([10.0, 0.0, 1500.0])
    assert times.get_xscale() == "log"  # 10 ms and 1.5 s: a hundredfold apart
    assert bar_widths(nodes) == [6, 9]  # the blocklisted pass has no bar
    assert bar_widths(params) == [1.0]  # KiB after fold_batchnorm; no bar for the export step
    assert params.get_title().startswith("parameters (KiB)")
    changes = {a.get_text() for ax in (nodes, params) for a in ax.texts}
    assert changes == {"-1", "+3", "-1.00 KiB"}
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["fx stage", "export stage"]
    assert [t.get_text() for t in latency.get_yticklabels()] == ["eager", "lite interpreter"]
    dots = [c for c in latency.collections if isinstance(c, PathCollection)]
    assert [sorted(np.asarray(d.get_offsets())[:, 0].tolist()) for d in dots] == [
        [2.0, 3.0, 4.0],
        [1.0, 1.5],
    ]


def test_a_real_report_plots_and_saves(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    report = fxmobile.optimize_fx(model, torch.randn(1, 3, 8, 8)).report
    fig = report.plot()
    assert len(fig.axes) == 3  # no latency, no latency panel
    assert len(bar_widths(fig.axes[0])) == len(report.passes)
    fig.savefig(tmp_path / "passes.png")
    assert (tmp_path / "passes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timings_keep_every_call_for_the_plot_and_leave_them_out_of_to_dict() -> None:
    timings = interleaved_medians({"a": lambda: None, "b": lambda: None}, rounds=7, warmup=0)
    for t in timings.values():
        assert len(t.samples_ms) == t.runs == 7
        assert sorted(t.samples_ms)[3] == t.median_ms
        assert set(t.to_dict()) == {"median_ms", "p10_ms", "p90_ms", "runs"}


def test_nothing_to_plot_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="no pass records and no latency"):
        Report(model_name="Net").plot()


def test_without_matplotlib_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(MissingDependencyError, match=r"pip install matplotlib"):
        hand_made().plot()
