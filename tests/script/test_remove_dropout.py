"""remove_dropout (TorchScript): dropout calls whose ``train`` is the constant False removed.

    dropout(x, p, False) -> x    (also dropout_, feature_dropout, feature_dropout_)

Counts of the dropout kinds, numerics against a float64 eager reference, and what stays, with
its reason: a dropout in training, a ``train`` that is not a constant, and any dropout in a
method other than ``forward`` (torch's pass reads ``forward`` only).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.script.remove_dropout import RemoveDropout
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.script.common import CTX, frozen, kinds

DROPOUT = "aten::dropout"


class Eval(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.dropout(x, 0.5, False) + F.dropout2d(x, 0.3, False)
        return y + F.dropout(x.clone(), 0.2, False, True)  # dropout_


def test_dropout_in_eval_is_removed() -> None:
    model = Eval()
    module = frozen(model)
    assert kinds(module)[DROPOUT] == 1 and kinds(module)["aten::feature_dropout"] == 1
    assert kinds(module)["aten::dropout_"] == 1
    result = RemoveDropout().call(module, CTX)
    assert result.rewrites == 3 and result.skips == {}
    after = kinds(result.unit)
    assert after[DROPOUT] == after["aten::feature_dropout"] == after["aten::dropout_"] == 0
    assert_equivalent(model, result.unit, torch.randn(2, 3, 4, 4))


def test_dropout_modules_in_eval_are_removed() -> None:
    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.Dropout(), nn.ReLU(), nn.Dropout2d()).eval()
    result = RemoveDropout().call(frozen(model), CTX)
    assert result.rewrites == 2
    assert not {DROPOUT, "aten::feature_dropout"} & set(kinds(result.unit))
    assert_equivalent(model, result.unit, torch.randn(2, 3, 4, 4))


SKIP = "aten::dropout with p not 0 and train not the constant False, or train False outside forward"


class Training(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.5, True) * 0 + x


class FlagFromInput(nn.Module):
    def forward(self, x: torch.Tensor, train: bool) -> torch.Tensor:
        return F.dropout(x, 0.5, train) * 0 + x


@pytest.mark.parametrize("model", [Training(), FlagFromInput()], ids=["training", "flag"])
def test_dropout_that_may_drop_stays_with_its_reason(model: nn.Module) -> None:
    result = RemoveDropout().call(frozen(model), CTX)
    assert result.rewrites == 0
    assert result.skips == {SKIP: 1}
    assert kinds(result.unit)[DROPOUT] == 1


class WithExport(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.5, False)

    @torch.jit.export
    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.5, False) * 2


def test_dropout_outside_forward_stays_with_its_reason() -> None:
    model = WithExport()
    ctx = ScriptContext(("forward", "features"), ("features",))
    result = RemoveDropout().call(frozen(model, ("features",)), ctx)
    assert result.rewrites == 1
    assert kinds(result.unit)[DROPOUT] == 0 and kinds(result.unit, "features")[DROPOUT] == 1
    assert result.skips == {SKIP: 1}
    x = torch.randn(4)
    assert_equivalent(model.features, result.unit.features, x)


class ZeroP(nn.Module):
    """``F.dropout(x, p=0)``: train defaults to True, and a trace records it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.dropout(x, 0.0, True)
        y.add_(1)  # ATen returns x itself when p is 0: the write reaches x, here as in eager
        return torch.feature_dropout(y, 0.0, True) * 2 + x


def test_dropout_with_p_zero_is_removed_whatever_train_says() -> None:
    """Fuzz finding F13: a traced F.dropout(x, p=0) kept aten::dropout(x, 0., True)."""
    model = ZeroP().eval()
    traced = torch.jit.freeze(torch.jit.trace(model, torch.randn(2, 3)))
    for module in (frozen(model), traced):
        result = RemoveDropout().call(module, CTX)
        assert result.rewrites == 2 and result.skips == {}
        assert not {DROPOUT, "aten::feature_dropout"} & set(kinds(result.unit))
        x = torch.randn(2, 3)
        expected = model(x.clone())
        torch.testing.assert_close(result.unit(x.clone()), expected)


class AlphaDropouts(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.alpha_dropout(x, 0.5, False) + F.feature_alpha_dropout(x, 0.5, False)
        return y + F.alpha_dropout(x, 0.0, True)


def test_alpha_dropout_in_eval_or_with_p_zero_is_removed() -> None:
    """Fuzz finding F13's twin: F.alpha_dropout(x, p=0) stayed (upstream's pass knows dropout
    and feature_dropout only)."""
    model = AlphaDropouts().eval()
    result = RemoveDropout().call(frozen(model), CTX)
    assert result.rewrites == 3 and result.skips == {}
    assert not [k for k in kinds(result.unit) if "dropout" in k]
    assert_equivalent(model, result.unit, torch.randn(2, 3, 4))


def test_a_module_without_forward_is_left_to_its_methods() -> None:
    class NoForward(nn.Module):
        @torch.jit.export
        def features(self, x: torch.Tensor) -> torch.Tensor:
            return F.dropout(x, 0.5, False)

    module = torch.jit.script(NoForward().eval())
    ctx = ScriptContext(("features",), ("features",))
    result = RemoveDropout().call(module, ctx)
    assert result.rewrites == 0 and kinds(result.unit, "features")[DROPOUT] == 1


def test_nothing_to_do_reports_zero() -> None:
    result = RemoveDropout().call(frozen(nn.Sequential(nn.ReLU())), CTX)
    assert result.rewrites == 0 and not result.modified and result.skips == {}
