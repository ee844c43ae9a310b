"""The gate looks beyond the example inputs (issue 24): besides them, it runs the optimized
module on fresh values of their shapes and dtypes, and on their values in another memory layout,
each compared with eager on the same inputs. A constant a trace computed from the example's
values, or a branch it took on their layout, then fails the gate instead of passing it."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from torch import fx, nn

import fxmobile
from fxmobile.api import gate
from fxmobile.api.fx_flow import Clock
from fxmobile.capture.reference import EXAMPLE, FRESH, eager_reference, input_sets
from fxmobile.options import make_options
from fxmobile.report import Report

X = torch.randn(1, 3, 8, 8)


class PeakNormalized(nn.Module):
    """Divides by the input's largest magnitude, read through numpy: neither torch.fx nor
    TorchScript takes it, and torch.jit.trace bakes the example's peak in as a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        peak = float(np.abs(x.detach().numpy()).max())
        return self.conv(x) / peak


class LayoutBranch(nn.Module):
    """Computes another thing when its activation is not contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.is_contiguous():
            return y * 2
        return y


def test_a_constant_baked_from_the_examples_values_fails_the_gate() -> None:
    """torch.jit.trace took the example's peak for a constant: right on the example inputs
    only. It was handed back; the fresh values show it."""
    model = PeakNormalized().eval()
    with (
        pytest.raises(fxmobile.NumericalMismatchError, match=r"\(fresh values\) is off by"),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # torch's tracer warnings
        fxmobile.optimize(model, example_inputs=X)


def test_a_layout_branch_a_trace_took_fails_the_gate() -> None:
    """The gate on a module traced with the example (contiguous) inputs: the channels-last
    inputs take the other branch in eager."""
    model = LayoutBranch().eval()
    options = make_options(example_inputs=X, backend="CPU")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, X)
    reference, _ = eager_reference(model, model, X if isinstance(X, tuple) else (X,), _args)
    report = Report(model_name="LayoutBranch", route="torch.fx")
    with pytest.raises(fxmobile.NumericalMismatchError, match=r"\(channels-last inputs\) is off"):
        gate.check(report, options, Clock(), reference, traced, lambda observe: None)
    example, fresh, layout = report.numerics or []
    assert example.passed and fresh.passed and not layout.passed


def _args(inputs: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return inputs, {}


def test_the_report_says_which_input_sets_were_checked() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    report = fxmobile.optimize(model, example_inputs=X).report
    assert [c.path for c in report.numerics or []] == [
        "output", "output (fresh values)", "output (channels-last inputs)",
    ]  # fmt: skip
    assert "output (channels-last inputs)" in str(report)


class CountsRealRuns(nn.Module):
    runs: ClassVar[list[int]] = []

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, fx.Proxy):
            CountsRealRuns.runs.append(1)
        return self.linear(x)


@pytest.mark.parametrize(("check", "runs"), [("off", 0), ("raise", 3), ("warn", 3)])
def test_check_off_runs_nothing_and_the_check_one_eager_run_per_set(check: str, runs: int) -> None:
    CountsRealRuns.runs.clear()
    result = fxmobile.optimize_fx(CountsRealRuns().eval(), torch.randn(2, 4), check=check)
    assert len(CountsRealRuns.runs) == runs
    assert len(result.report.numerics or []) == runs


class Noisy(nn.Module):
    """Adds noise in forward: its outputs differ from run to run."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y + 0.1 * torch.randn_like(y)


@pytest.mark.parametrize("entry", ["optimize_fx", "optimize"])
def test_a_model_that_draws_random_numbers_is_not_broken(entry: str) -> None:
    """Eager and the optimized module draw from one seed on each input set (the caller's
    random state is left as it was)."""
    model = Noisy().eval()
    state = torch.random.get_rng_state()
    if entry == "optimize_fx":
        report = fxmobile.optimize_fx(model, X).report
    else:  # channels-last activations would draw the noise in another order
        report = fxmobile.optimize(model, example_inputs=X, channels_last=False).report
    assert report.numerics_passed and len(report.numerics or []) == 3
    assert torch.equal(torch.random.get_rng_state(), state)


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) * scale


def test_input_sets_draw_floats_anew_and_keep_integers_as_given() -> None:
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    images = torch.rand(2, 3, 4, 4) * 4 + 10.0
    sets = input_sets((ids, images, 3.0))
    assert [s.name for s in sets] == [EXAMPLE, FRESH, "non-contiguous and channels-last inputs"]
    _, fresh, layout = sets
    assert fresh.inputs[0] is ids and fresh.inputs[2] == 3.0
    assert fresh.inputs[1].shape == images.shape and fresh.inputs[1].dtype == images.dtype
    assert not torch.equal(fresh.inputs[1], images)
    drawn = fresh.inputs[1]
    assert abs(float(drawn.mean()) - 12.0) < 1.0 and 0.5 < float(drawn.std()) < 2.0, "its scale"
    assert float(drawn.abs().max()) != float(images.abs().max())
    assert torch.equal(layout.inputs[0], ids) and not layout.inputs[0].is_contiguous()
    assert layout.inputs[1].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(layout.inputs[1], images)


def test_integer_inputs_are_given_as_they_are_and_the_model_checked() -> None:
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    report = fxmobile.optimize_fx(TokenModel().eval(), (ids, torch.tensor(2.0))).report
    assert report.numerics_passed


class ViewsItsInput(nn.Module):
    """``view`` cannot flatten a channels-last input: eager itself fails on that set."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(12, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.view(x.shape[0], -1))


def test_a_set_eager_cannot_run_is_skipped_with_a_note() -> None:
    result = fxmobile.optimize_fx(ViewsItsInput().eval(), torch.randn(2, 3, 2, 2))
    assert result.report.numerics_passed
    assert len(result.report.numerics or []) == 2
    assert any(
        n.startswith("not checked on channels-last inputs: eager's forward fails on them")
        for n in result.report.notes
    )


@pytest.mark.parametrize("check", ["raise", "warn", "off"])
def test_executorch_program_refuses_a_layout_branch(check: str) -> None:
    """ExecuTorch's program holds the branch the example took: a model whose outputs change
    with its inputs' layout is refused before the export, whatever ``check`` says (the gate's
    channels-last set would catch it too, but not with the check off)."""
    pytest.importorskip("executorch")
    with pytest.raises(fxmobile.ExportError, match=r"for channels-last copies.*memory layout"):
        fxmobile.optimize(
            LayoutBranch().eval(), example_inputs=X, target_runtime="executorch", check=check
        )
