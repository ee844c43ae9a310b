"""The numerical check is a gate: a module that differs from eager is not handed back."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile.passes import matchers
from fxmobile.script import fuse_clamp
from tests.helpers import randomize_batchnorm

X = torch.randn(1, 3, 12, 12)


def model() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))
    return randomize_batchnorm(net).eval()


@pytest.fixture
def wrong_batchnorm_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug: the BN fold scales 10% too much."""
    right = matchers.BatchNormCall.scale_shift

    def wrong(self: matchers.BatchNormCall) -> tuple[torch.Tensor, torch.Tensor]:
        s, t = right(self)
        return s * 1.1, t

    monkeypatch.setattr(matchers.BatchNormCall, "scale_shift", wrong)


@pytest.fixture
def wrong_clamp_fusion(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug: relu fused as a clamp to [0, 0.1]."""
    right = fuse_clamp.activation_bounds

    def wrong(node: Any) -> Any:
        bounds = right(node)
        return (0.0, 0.1) if node.kind() in ("aten::relu", "aten::relu_") else bounds

    monkeypatch.setattr(fuse_clamp, "activation_bounds", wrong)


ENTRY_POINTS = {
    "optimize_fx": lambda m, **kw: fxmobile.optimize_fx(m, X, **kw),
    "optimize": lambda m, **kw: fxmobile.optimize(m, example_inputs=X, **kw),
    "optimize_for_mobile": lambda m, **kw: fxmobile.optimize_for_mobile(m, example_inputs=X, **kw),
}


@pytest.mark.usefixtures("wrong_batchnorm_fold")
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_mismatch_raises_naming_output_error_and_first_diverging_pass(entry: str) -> None:
    with pytest.raises(fxmobile.NumericalMismatchError) as info:
        ENTRY_POINTS[entry](model())
    err = info.value
    assert isinstance(err, fxmobile.FxMobileError) and isinstance(err, ValueError)
    message = str(err)
    assert "does not match eager: output is off by" in message
    assert "the outputs first diverge after fx pass 'fold_batchnorm'" in message
    assert err.report.numerics_passed is False
    assert [r.name for r in err.report.passes][:5] == [
        "remove_dropout", "remove_identity", "eliminate_dead_code", "fold_constants",
        "fold_batchnorm",
    ]  # fmt: skip


@pytest.mark.usefixtures("wrong_clamp_fusion")
def test_first_diverging_pass_can_be_a_torchscript_pass() -> None:
    with pytest.raises(fxmobile.NumericalMismatchError, match="after script pass 'fuse_clamp'"):
        fxmobile.optimize(model(), example_inputs=X)


@pytest.mark.usefixtures("wrong_batchnorm_fold")
def test_check_warn_returns_the_module_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="check='warn'"):
        result = fxmobile.optimize(model(), example_inputs=X, check="warn")
    assert result.report.numerics_passed is False
    assert any("first diverge after fx pass 'fold_batchnorm'" in n for n in result.report.notes)


@pytest.mark.usefixtures("wrong_batchnorm_fold")
def test_check_off_runs_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = fxmobile.optimize(model(), example_inputs=X, check=fxmobile.Check.OFF)
    assert result.report.numerics is None
    assert result.report.check_seconds == 0.0


def test_check_must_be_one_of_three() -> None:
    with pytest.raises(fxmobile.InvalidArgumentError, match="'raise', 'warn' or 'off'"):
        fxmobile.optimize(model(), example_inputs=X, check="strict")


def test_a_nan_where_eager_has_none_fails_the_check() -> None:
    from fxmobile.verify import compare_outputs

    eager = torch.tensor([1.0, float("nan"), 2.0])
    assert compare_outputs(eager, eager.clone(), 1e-4)[0].passed, "NaN where eager has NaN"
    (check,) = compare_outputs(eager, torch.tensor([float("nan"), float("nan"), 2.0]), 1e-4)
    assert not check.passed and check.max_abs_error == float("inf")


def test_times_are_reported_apart() -> None:
    report = fxmobile.optimize(model(), example_inputs=X).report
    assert report.optimize_seconds is not None and report.optimize_seconds > 0
    assert report.check_seconds is not None and report.check_seconds > 0
