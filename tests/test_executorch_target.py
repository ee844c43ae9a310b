"""``optimize(..., target_runtime="executorch")``: the ExecuTorch program, its report and its gate.

The models are small, so a lowering takes seconds; ExecuTorch's first lowering in a process
pays its imports, so the module's first test warms it up.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile.api import fx_flow
from fxmobile.errors import CaptureError, ExportError, MissingDependencyError
from fxmobile.executorch.lower import NO_CONFIG
from fxmobile.executorch.runtime import ProgramRunner, set_threads
from fxmobile.report import Stage
from tests.helpers import assert_equivalent, randomize_batchnorm

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(self.pool(y), 1))


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return randomize_batchnorm(SmallNet()).eval()


@pytest.fixture(scope="module")
def lowered_small_net() -> tuple[nn.Module, torch.Tensor, fxmobile.ProgramResult]:
    model, x = small_net(), torch.randn(2, 3, 16, 16)
    return model, x, fxmobile.optimize(model, example_inputs=x, target_runtime="executorch")


def test_a_small_cnn_is_one_delegate_call_and_matches_eager(
    lowered_small_net: tuple[nn.Module, torch.Tensor, fxmobile.ProgramResult],
) -> None:
    model, x, result = lowered_small_net
    program = result.report.program
    assert program is not None
    assert program.delegate_calls == 1
    assert program.portable_ops == ()
    assert program.delegated_ops >= 3  # the conv (BatchNorm folded), relu, pool, linear
    assert result.report.numerics_passed
    assert_equivalent(model, result.run, x)


def test_the_saved_program_loads_in_executorchs_runtime_and_runs_as_the_result(
    lowered_small_net: tuple[nn.Module, torch.Tensor, fxmobile.ProgramResult], tmp_path: Path
) -> None:
    _, x, result = lowered_small_net
    path = tmp_path / "small.pte"
    result.save(path)
    assert path.read_bytes() == result.buffer
    assert result.report.program is not None
    assert result.report.program.nbytes == len(result.buffer)
    loaded = ProgramRunner(str(path))
    assert loaded.input_specs() == [((2, 3, 16, 16), torch.float32)]
    assert torch.equal(loaded(x), result.run(x))


def test_a_program_keeps_running_after_the_xnnpack_pool_is_resized(
    lowered_small_net: tuple[nn.Module, torch.Tensor, fxmobile.ProgramResult],
) -> None:
    # A method keeps a pointer to the pool it was loaded with: resizing the pool freed it, and
    # a later call ran on freed memory (the benchmark segfaulted in libexecutorch_threadpool.so;
    # a use after free does not crash every time, so this checks the results).
    _, x, result = lowered_small_net
    before = result.run(x)
    assert set_threads(1) == 1
    assert torch.equal(result.run(x), before)
    assert set_threads(2) == 2
    assert torch.equal(result.run(x), before)


def test_the_report_times_export_and_lowering_after_the_fx_passes(
    lowered_small_net: tuple[nn.Module, torch.Tensor, fxmobile.ProgramResult],
) -> None:
    report = lowered_small_net[2].report
    stages = [(r.stage, r.name) for r in report.passes]
    assert stages.index((Stage.FX, "fold_batchnorm")) < stages.index((Stage.EXPORT, "torch.export"))
    assert stages[-2:] == [
        (Stage.LOWER, "to_edge_transform_and_lower"),
        (Stage.LOWER, "to_executorch"),
    ]
    assert report.record("fold_batchnorm").rewrites == 1
    steps = [r.name for r in report.passes if r.step]
    assert steps == ["torch.export", "to_edge_transform_and_lower", "to_executorch"]
    assert all(r.seconds > 0 for r in report.passes if r.stage in (Stage.EXPORT, Stage.LOWER))
    assert report.backend == "ExecuTorch (XNNPACK delegate)"
    assert "ExecuTorch program:" in str(report)
    assert report.to_dict()["program"]["delegate_calls"] == 1


def test_the_caller_model_is_left_as_it_was() -> None:
    model = small_net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fxmobile.optimize(model, example_inputs=torch.randn(1, 3, 8, 8), target_runtime="executorch")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert any(type(m) is nn.BatchNorm2d for m in model.modules())


class Cumulative(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(torch.relu(x), 1)


def test_an_op_xnnpack_has_no_kernel_for_is_listed_with_the_reason() -> None:
    x = torch.randn(2, 6)
    result = fxmobile.optimize(Cumulative(), example_inputs=x, target_runtime="executorch")
    program = result.report.program
    assert program is not None
    left = {p.op: p for p in program.portable_ops}
    assert left["aten.cumsum"].count == 1
    assert left["aten.cumsum"].reason == NO_CONFIG
    assert "aten.cumsum" in str(result.report)
    assert torch.allclose(result.run(x), torch.cumsum(torch.relu(x), 1))


class ValueBranch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_a_model_torch_export_cannot_take_is_refused_naming_the_lite_interpreter_route() -> None:
    with pytest.raises(
        ExportError, match=r"torch.export could not take ValueBranch.*-o model\.ptl"
    ):
        fxmobile.optimize(ValueBranch(), example_inputs=torch.randn(3), target_runtime="executorch")


def test_where_torch_fx_declines_torch_export_takes_the_eager_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def declines(*_: object) -> None:
        raise CaptureError("torch.fx declined this model (as a test)")

    monkeypatch.setattr(fx_flow, "capture", declines)
    model, x = small_net(), torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(model, example_inputs=x, target_runtime="executorch")
    assert result.report.route == "torch.export"
    assert result.report.declined == ["torch.fx: torch.fx declined this model (as a test)"]
    assert not [r for r in result.report.passes if r.stage is Stage.FX]
    assert result.report.numerics_passed
    assert_equivalent(model, result.run, x)


class SeedsInForward(nn.Module):
    """Seeds torch's generator in a forward torch.fx cannot trace (a branch on the layout that
    computes the same either way), so only torch.export's run of it sees the call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(123)
        if x.is_contiguous():
            return x + 1
        return (x + 1).contiguous()


def test_a_seed_call_in_forward_is_refused_on_the_export_route_whatever_check_says() -> None:
    x = torch.randn(1, 3, 4, 4)
    for check in ("raise", "off"):
        with pytest.raises(fxmobile.RefusedError, match=r"SeedsInForward.forward calls"):
            fxmobile.optimize(
                SeedsInForward(), example_inputs=x, target_runtime="executorch", check=check
            )


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (
            lambda m, x: fxmobile.optimize(
                torch.jit.script(m), example_inputs=x, target_runtime="executorch"
            ),
            fxmobile.InvalidArgumentError,
            "pass the eager model",
        ),
        (
            lambda m, x: fxmobile.optimize(
                m, backend="vulkan", example_inputs=x, target_runtime="executorch"
            ),
            fxmobile.InvalidValueError,
            "backend='CPU'",
        ),
        (
            lambda m, x: fxmobile.optimize(m, target_runtime="executorch"),
            fxmobile.InvalidValueError,
            "needs example_inputs",
        ),
        (
            lambda m, x: fxmobile.optimize(
                m, preserved_methods=["forward"], example_inputs=x, target_runtime="executorch"
            ),
            fxmobile.InvalidValueError,
            "preserved_methods",
        ),
    ],
    ids=["script-module", "vulkan", "no-inputs", "preserved-methods"],
)
def test_what_the_target_cannot_take_is_refused_with_the_fix(
    call: object, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        call(small_net(), torch.randn(1, 3, 8, 8))  # type: ignore[operator]


def test_without_executorch_installed_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("fxmobile.executorch.available", lambda: False)
    with pytest.raises(MissingDependencyError, match=r"fxmobile\[executorch\]"):
        fxmobile.optimize(
            small_net(), example_inputs=torch.randn(1, 3, 8, 8), target_runtime="executorch"
        )
