"""The ExecuTorch benchmark's verdicts and its per-op profile: the target check that decides
which (model, thread count) gets profiled, the aggregation of ETDump events into op kinds, the
side-by-side table, and one tiny model profiled end to end in this process."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks import bench_executorch
from benchmarks import executorch_op_profile as op_profile
from benchmarks.bench_executorch import (
    PROFILED,
    ModelRun,
    Program,
    meets,
    profiles,
    to_json,
    verdicts,
)
from fxmobile.runtime.latency import Latency
from fxmobile.timing import summarize

CONV = "Convolution (NHWC, F32) IGEMM"
GEMM = "Fully Connected (NC, F32) GEMM"


def _latency(median_ms: float) -> Latency:
    return Latency(summarize([median_ms] * 5), "here", "XNNPACK")


def _run(kind: str, fxm_ms: float, own_ms: float) -> ModelRun:
    run = ModelRun("m", kind)
    run.latency[1] = {"pte_fxm": _latency(fxm_ms), "pte_et": _latency(own_ms)}
    return run


def _profile(us: float) -> op_profile.Profile:
    return op_profile.aggregate(
        [(f"{CONV} #1", True, [us, us]), ("DELEGATE_CALL", False, [us + 1, us + 1])]
    )


def test_meets_compares_the_median_ratio_with_the_kinds_target() -> None:
    assert meets(_run("cnn", 10.0, 9.6), 1) is True  # 0.96x >= 0.95x
    assert meets(_run("cnn", 10.0, 9.4), 1) is False
    assert meets(_run("transformer", 10.0, 12.0), 1) is False  # 1.2x < 1.3x
    assert meets(_run("transformer", 10.0, 13.5), 1) is True
    assert meets(_run("cnn", 10.0, 9.4), 2) is None  # not timed at 2 threads
    lines = verdicts([_run("cnn", 10.0, 9.4), _run("transformer", 10.0, 13.5)], [1, 2])
    assert ["MISSES" in line for line in lines] == [True, False]


def test_aggregate_sums_each_kind_per_run_and_takes_the_median() -> None:
    found = op_profile.aggregate(
        [
            (f"{CONV} #1", True, [10.0, 30.0, 20.0]),
            (f"{CONV} #2", True, [5.0, 1.0, 3.0]),
            (f"{GEMM} #1", True, [2.0, 2.0, 2.0]),
            ("DELEGATE_CALL", False, [20.0, 40.0, 30.0]),
            ("native_call_cumsum.out", False, [7.0, 9.0, 8.0]),
            ("DELEGATE_CALL", False, [3.0, 3.0, 4.0]),
            ("Method::execute", False, [40.0, 60.0, 50.0]),
        ]
    )
    # per run 15, 31, 23: the median of the sums, not the sum of the medians (20 + 3)
    assert found[CONV] == op_profile.OpKind("XNNPACK", 2, 23.0)
    assert found[GEMM] == op_profile.OpKind("XNNPACK", 1, 2.0)
    assert found["cumsum.out"] == op_profile.OpKind("portable", 1, 8.0)
    assert found["DELEGATE_CALL"] == op_profile.OpKind("runtime", 2, 34.0)
    assert found["Method::execute"] == op_profile.OpKind("runtime", 1, 50.0)
    assert found[op_profile.XNNPACK_SUM] == op_profile.OpKind("sum", 3, 25.0)
    assert found[op_profile.PORTABLE_SUM] == op_profile.OpKind("sum", 1, 8.0)
    assert op_profile.has_operator_events(found)
    spans_only = op_profile.aggregate([("DELEGATE_CALL", False, [3.0])])
    assert not op_profile.has_operator_events(spans_only)


def test_aggregate_refuses_events_with_different_numbers_of_runs() -> None:
    with pytest.raises(ValueError, match="'DELEGATE_CALL' has 1 times, the first event had 2"):
        op_profile.aggregate([(f"{CONV} #1", True, [1.0, 2.0]), ("DELEGATE_CALL", False, [3.0])])


def test_side_by_side_lists_both_programs_largest_difference_first() -> None:
    fxm = op_profile.aggregate(
        [
            (f"{CONV} #1", True, [100.0]),
            (f"{GEMM} #1", True, [50.0]),
            ("DELEGATE_CALL", False, [160.0]),
            ("Method::execute", False, [170.0]),
        ]
    )
    own = op_profile.aggregate(
        [
            (f"{CONV} #1", True, [104.0]),
            (f"{GEMM} #1", True, [20.0]),
            ("DELEGATE_CALL", False, [130.0]),
            ("native_call_cumsum.out", False, [40.0]),
            ("DELEGATE_CALL", False, [10.0]),
            ("Method::execute", False, [190.0]),
        ]
    )
    lines = op_profile.side_by_side(fxm, own, ("fxmobile", "own")).splitlines()
    assert lines[0].split()[:3] == ["op", "runs", "in"]
    rows = [line.split("  ") for line in lines[2:]]
    names = [next(cell.strip() for cell in row if cell.strip()) for row in rows]
    assert names == [
        "Method::execute",
        "DELEGATE_CALL",
        op_profile.XNNPACK_SUM,
        op_profile.PORTABLE_SUM,
        "cumsum.out",  # +40, only in own
        GEMM,  # -30
        CONV,  # +4
    ]
    assert lines[2].split()[-5:] == ["1", "170", "1", "190", "+20"]
    assert lines[3].split()[-5:] == ["1", "160", "2", "140", "-20"]
    assert lines[6].split()[-5:] == ["-", "-", "1", "40", "+40"]


def test_profiles_print_and_serialize_each_profile_taken() -> None:
    run = _run("cnn", 10.0, 9.0)
    run.programs = {name: Program(b"", None, 1, 0, 1.0, 10) for name in PROFILED}
    run.profiles[1] = {"pte_fxm": _profile(100.0), "pte_et": _profile(80.0)}
    printed = profiles([run], 10)
    assert printed.startswith("m, 1 thread (0.90x by medians, target 0.95x)")
    assert "over 10 ETDump runs" in printed and "holds no XNNPACK" not in printed
    (found,) = to_json([run])
    assert found["profiles"][1]["pte_et"][CONV] == {"where": "XNNPACK", "calls": 1, "us": 80.0}
    assert found["own_over_fxmobile"][1] == pytest.approx(0.9)


class _ConvCumsumLinear(nn.Module):
    """A convolution and a linear in two delegate calls, a cumsum between them on a portable
    kernel (XNNPACK has none)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.linear = nn.Linear(14, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cumsum(self.conv(x).relu(), -1))


@pytest.mark.slow  # ExecuTorch's first lowering in a process: about 35 s here
def test_profile_of_a_tiny_program_in_this_process() -> None:
    from benchmarks.bench_executorch import own_flow
    from fxmobile.executorch.runtime import set_threads

    torch.manual_seed(0)
    model = _ConvCumsumLinear().eval()
    inputs = (torch.randn(1, 3, 16, 16),)
    program = own_flow(model, inputs)
    set_threads(1)
    found = op_profile.profile({"a": program.buffer, "b": program.buffer}, inputs, runs=3)
    for profile in found.values():
        assert profile["DELEGATE_CALL"].calls == program.delegate_calls == 2
        assert profile[op_profile.PORTABLE_SUM].calls == program.portable_ops == 1
        assert profile["cumsum.out"].where == "portable"
        # the pip runtime logs XNNPACK's operators in this process too
        assert profile[CONV].calls == profile[GEMM].calls == 1
        assert profile["Method::execute"].us >= profile["DELEGATE_CALL"].us > 0


def test_regression_a_model_that_cannot_be_built_leaves_the_others_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A missing package (transformers) raised out of main() after 40 minutes of measuring the
    # models before it, and every figure was lost with it.
    def fake_bench(spec: str, *args: object) -> ModelRun:
        if spec == "resnet18":
            raise ModuleNotFoundError("No module named 'transformers'")
        return _run("cnn", 10.0, 10.0)

    monkeypatch.setattr(bench_executorch, "bench", fake_bench)
    monkeypatch.setattr(bench_executorch, "installed", lambda _runtime: False)
    found = tmp_path / "figures.json"
    argv = ["bench_executorch.py", "--models", "resnet18", "mobilenet_v2", "--threads", "1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--json", str(found)])
    bench_executorch.main()
    models = json.loads(found.read_text())["models"]
    assert [m["model"] for m in models] == ["resnet18", "m"]
    assert models[0]["errors"] == {"model": "ModuleNotFoundError: No module named 'transformers'"}
    assert models[1]["latency"]["1"]["pte_fxm"]["median_ms"] == 10.0


def test_regression_a_missing_ecosystem_package_stops_the_run_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the run above: 40 minutes of figures before the first transformers model found no package
    def no_bench(*_args: object) -> ModelRun:
        raise AssertionError("a model was measured")

    monkeypatch.setattr(bench_executorch, "bench", no_bench)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else name
    )
    argv = ["bench_executorch.py", "--models", "resnet18", "transformers:deit"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stopped:
        bench_executorch.main()
    assert stopped.value.code == 2
    assert "need transformers: pip install -e '.[ecosystem]'" in capsys.readouterr().err
