"""RemoveDropout: every dropout kind goes in eval; functional dropout when training=False or p=0."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from fxmobile.passes.remove_dropout import DROPOUT_FUNCTIONS, DROPOUT_MODULES, RemoveDropout
from fxmobile.passes.stage import FxContext
from tests.helpers import assert_equivalent, count_calls, count_modules


def _run(model: nn.Module) -> tuple[fx.GraphModule, int, dict[str, int]]:
    gm = fx.symbolic_trace(model)
    result = RemoveDropout().call(gm, FxContext())
    gm.graph.lint()
    gm.recompile()
    return gm, result.rewrites, result.skips


def _input_for(kind: object) -> torch.Tensor:
    """Dropout1d and Dropout3d check their input's rank even in eval mode."""
    rank = {nn.Dropout1d: 3, nn.Dropout3d: 5, F.dropout1d: 3, F.dropout3d: 5}.get(kind, 4)
    return torch.randn(2, 3, *([4] * (rank - 2)))


@pytest.mark.parametrize("kind", DROPOUT_MODULES)
def test_every_dropout_module_is_removed(kind: type[nn.Module]) -> None:
    model = nn.Sequential(nn.ReLU(), kind(0.3), nn.Hardtanh()).eval()  # type: ignore[call-arg]
    gm, rewrites, _ = _run(model)
    assert rewrites == 1 and count_modules(gm, kind) == 0
    assert not any(isinstance(m, kind) for m in gm.modules())  # submodule dropped too
    assert_equivalent(model, gm, _input_for(kind))


class Functional(nn.Module):
    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fn in (
            torch.dropout,
            torch.alpha_dropout,
            torch.feature_dropout,
            torch.feature_alpha_dropout,
        ):
            return self.fn(x, 0.5, self.training) + 1  # type: ignore[operator]
        return self.fn(x, 0.5, training=self.training) + 1  # type: ignore[operator]


@pytest.mark.parametrize("fn", list(DROPOUT_FUNCTIONS), ids=lambda f: f.__name__)
def test_functional_dropout_with_training_false_is_removed(fn: object) -> None:
    model = Functional(fn).eval()
    gm, rewrites, _ = _run(model)
    assert rewrites == 1 and count_calls(gm, fn) == 0
    assert_equivalent(model, gm, _input_for(fn))


class DefaultTraining(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.5)  # training defaults to True: really drops, even in eval


def test_functional_dropout_defaulting_to_training_is_kept_and_reported() -> None:
    gm, rewrites, skips = _run(DefaultTraining().eval())
    assert rewrites == 0 and count_calls(gm, F.dropout) == 1
    assert skips == {"functional dropout with training not constant False": 1}


def test_dropout_module_left_in_training_mode_is_kept() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout()).eval()
    model[1].train()
    gm, rewrites, skips = _run(model)
    assert rewrites == 0 and count_modules(gm, nn.Dropout) == 1
    assert skips == {"dropout module in training mode": 1}


class NeverDrops(nn.Module):
    """Dropout with p=0 in training mode returns its input itself: the relu_ writes ``y``."""

    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        if self.fn in (torch.dropout, torch.feature_dropout):
            dropped = self.fn(y, 0.0, True)  # type: ignore[operator]
        elif self.fn in (torch.alpha_dropout, torch.feature_alpha_dropout):
            dropped = self.fn(y, p=0, train=True)  # type: ignore[operator]
        else:
            dropped = self.fn(y, p=0.0, training=True)  # type: ignore[operator]
        return torch.relu_(dropped), y


@pytest.mark.parametrize("fn", list(DROPOUT_FUNCTIONS), ids=lambda f: f.__name__)
def test_dropout_that_never_drops_is_removed_in_training_mode_too(fn: object) -> None:
    model = NeverDrops(fn).eval()
    gm, rewrites, _ = _run(model)
    assert rewrites == 1 and count_calls(gm, fn) == 0
    x = _input_for(fn)
    with torch.no_grad():
        for got, expected in zip(gm(x), model(x), strict=True):
            assert torch.equal(got, expected)


def test_dropout_module_with_p_zero_in_training_mode_is_removed() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.0), nn.ReLU(inplace=True)).eval()
    model[1].train()
    gm, rewrites, skips = _run(model)
    assert rewrites == 1 and count_modules(gm, nn.Dropout) == 0 and skips == {}


def test_nothing_to_do_reports_unmodified() -> None:
    gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)).eval())
    result = RemoveDropout().call(gm, FxContext())
    assert result.rewrites == 0 and not result.modified and result.skips == {}
