"""RemoveDropout: every dropout kind goes in eval; functional dropout when training=False or p=0."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import fxmobile
from fxmobile.passes.remove_dropout import RemoveDropout
from fxmobile.passes.stage import FxContext
from tests.helpers import assert_equivalent, count_calls, count_modules

DropoutFn = Callable[..., torch.Tensor]  # F.dropout, torch.dropout and their kin


def _run(model: nn.Module) -> tuple[fx.GraphModule, int, Mapping[str, int]]:
    gm = fx.symbolic_trace(model)
    result = RemoveDropout().call(gm, FxContext())
    gm.graph.lint()
    gm.recompile()
    return gm, result.rewrites, result.skips


# Written out here, not read from the pass's own tables: a kind dropped from those tables must
# fail these tests.
MODULES = [
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
]
FUNCTIONS = [
    F.dropout,
    F.dropout1d,
    F.dropout2d,
    F.dropout3d,
    F.alpha_dropout,
    F.feature_alpha_dropout,
    torch.dropout,
    torch.alpha_dropout,
    torch.feature_dropout,
    torch.feature_alpha_dropout,
]


def _input_for(kind: object) -> torch.Tensor:
    """Dropout1d and Dropout3d check their input's rank even in eval mode."""
    rank = {nn.Dropout1d: 3, nn.Dropout3d: 5, F.dropout1d: 3, F.dropout3d: 5}.get(kind, 4)
    return torch.randn(2, 3, *([4] * (rank - 2)))


@pytest.mark.parametrize("kind", MODULES)
def test_every_dropout_module_is_removed(kind: type[nn.Module]) -> None:
    model = nn.Sequential(nn.ReLU(), kind(0.3), nn.Hardtanh()).eval()
    gm, rewrites, _ = _run(model)
    assert rewrites == 1 and count_modules(gm, kind) == 0
    assert not any(isinstance(m, kind) for m in gm.modules())  # submodule dropped too
    assert_equivalent(model, gm, _input_for(kind))


class Functional(nn.Module):
    def __init__(self, fn: DropoutFn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fn in (
            torch.dropout,
            torch.alpha_dropout,
            torch.feature_dropout,
            torch.feature_alpha_dropout,
        ):
            return self.fn(x, 0.5, self.training) + 1
        return self.fn(x, 0.5, training=self.training) + 1


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_functional_dropout_with_training_false_is_removed(fn: DropoutFn) -> None:
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


# function -> whether it drops when ``training`` is not passed (F.alpha_dropout and
# F.feature_alpha_dropout default to training=False, the others to True; torch's own functions
# take it positionally with no default, so a call without it is assumed to drop)
DEFAULT_DROPS: dict[DropoutFn, bool] = {
    F.dropout: True,
    F.dropout1d: True,
    F.dropout2d: True,
    F.dropout3d: True,
    F.alpha_dropout: False,
    F.feature_alpha_dropout: False,
    torch.dropout: True,
    torch.alpha_dropout: True,
    torch.feature_dropout: True,
    torch.feature_alpha_dropout: True,
}


def _call_without_training(fn: DropoutFn) -> fx.GraphModule:
    """``fn(x, 0.5) + 1`` built by hand: symbolic tracing writes every default out, another
    tracer or a hand-made graph need not."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    dropped = graph.call_function(fn, (x, 0.5))
    graph.output(graph.call_function(torch.add, (dropped, 1)))
    return fx.GraphModule(nn.Module(), graph)


@pytest.mark.parametrize("fn", list(DEFAULT_DROPS), ids=lambda f: f"{f.__module__}.{f.__name__}")
def test_functional_dropout_without_a_training_argument_follows_its_default(fn: DropoutFn) -> None:
    gm = _call_without_training(fn)
    result = RemoveDropout().call(gm, FxContext())
    gm.recompile()
    if DEFAULT_DROPS[fn]:
        assert result.rewrites == 0 and count_calls(gm, fn) == 1
        assert result.skips == {"functional dropout with training not constant False": 1}
    else:
        assert result.rewrites == 1 and count_calls(gm, fn) == 0 and result.skips == {}
        x = _input_for(fn)
        assert torch.equal(gm(x), x + 1)


def test_symbolic_tracing_writes_the_default_out() -> None:
    class Defaults(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.alpha_dropout(x, 0.5) + F.dropout(x, 0.5)

    gm, rewrites, skips = _run(Defaults().eval())
    assert rewrites == 1 and count_calls(gm, F.alpha_dropout) == 0
    assert skips == {"functional dropout with training not constant False": 1}


class Keywords(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.dropout(x, p=0.5, training=False) + torch.dropout(x, 0.5, train=False)
        return y + F.dropout(input=x, training=False)


def test_functional_dropout_with_training_false_by_keyword_is_removed() -> None:
    gm, rewrites, skips = _run(Keywords().eval())
    assert rewrites == 3 and skips == {}
    assert count_calls(gm, F.dropout) == count_calls(gm, torch.dropout) == 0
    assert_equivalent(Keywords(), gm, torch.randn(2, 3))


class TrainingFromInput(nn.Module):
    def forward(self, x: torch.Tensor, training: bool) -> torch.Tensor:
        return F.dropout(x, 0.5, training)


def test_functional_dropout_with_a_training_flag_from_the_input_is_kept() -> None:
    gm = fx.symbolic_trace(TrainingFromInput(), concrete_args=None)
    result = RemoveDropout().call(gm, FxContext())
    assert result.rewrites == 0
    assert result.skips == {"functional dropout with training not constant False": 1}


def test_dropout_module_left_in_training_mode_is_kept() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout()).eval()
    model[1].train()
    gm, rewrites, skips = _run(model)
    assert rewrites == 0 and count_modules(gm, nn.Dropout) == 1
    assert skips == {"dropout module in training mode": 1}


class NeverDrops(nn.Module):
    """Dropout with p=0 in training mode returns its input itself: the relu_ writes ``y``."""

    def __init__(self, fn: DropoutFn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        if self.fn in (torch.dropout, torch.feature_dropout):
            dropped = self.fn(y, 0.0, True)
        elif self.fn in (torch.alpha_dropout, torch.feature_alpha_dropout):
            dropped = self.fn(y, p=0, train=True)
        else:
            dropped = self.fn(y, p=0.0, training=True)
        return torch.relu_(dropped), y


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_dropout_that_never_drops_is_removed_in_training_mode_too(fn: DropoutFn) -> None:
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


class ScalesInEval(nn.Dropout):
    """A dropout subclass whose forward does more, and does not trace (a branch on a value)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.sum() > 0:
            return input * 3
        return input


class SubclassedDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.drop = ScalesInEval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin(x))


def test_regression_a_dropout_subclass_overriding_forward_is_kept() -> None:
    """torch.fx cannot trace into ``ScalesInEval``, so capture keeps it a module call, and the
    pass took any instance of nn.Dropout for a dropout: the module returned ``lin(x)`` where
    eager returned ``3 * lin(x)``. Found reading the full mutation run's survivors (the
    why_customized branch was never taken)."""
    model = SubclassedDropout().eval()
    x = torch.ones(2, 3) * 5
    result = fxmobile.optimize_fx(model, (x,), check="off")
    assert count_modules(result.graph_module, ScalesInEval) == 1
    assert result.report.record("remove_dropout").skips == {
        "ScalesInEval overrides Dropout.forward": 1
    }
    assert_equivalent(model, result.graph_module, x)


class KeptThenRemovable(nn.Module):
    """One dropout of each kind the pass keeps, each followed by one it removes."""

    def __init__(self) -> None:
        super().__init__()
        self.training_mode, self.hooked = nn.Dropout(0.5), nn.Dropout(0.5)
        self.plain = nn.ModuleList(nn.Dropout(0.5) for _ in range(3))
        self.hooked.register_forward_hook(lambda module, args, out: out * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.plain[0](self.training_mode(x))
        y = self.plain[1](self.hooked(y))
        y = F.dropout(F.dropout(y, 0.5), 0.5, training=False)
        return self.plain[2](self.drop_input_by_keyword(y))

    def drop_input_by_keyword(self, y: torch.Tensor) -> torch.Tensor:
        return torch.dropout(y, 0.0, train=True) + self.plain[2](input=y)


def test_a_kept_dropout_does_not_stop_the_pass_and_each_says_why() -> None:
    model = KeptThenRemovable().eval()
    model.training_mode.train()
    gm, rewrites, skips = _run(model)
    # removed: plain[0], plain[1], the training=False call, torch.dropout(p=0), both plain[2]
    assert rewrites == 6
    assert skips == {
        "dropout module in training mode": 1,
        "Dropout has forward hooks": 1,
        "functional dropout with training not constant False": 1,
    }
    assert count_modules(gm, nn.Dropout) == 2
    x = torch.randn(2, 3)
    with torch.random.fork_rng(), torch.no_grad():  # the kept ones draw: the same draws
        torch.manual_seed(0)
        expected = model(x)
        torch.manual_seed(0)
        assert torch.equal(gm(x), expected)


def test_a_dropout_of_a_tensor_literal_is_kept_and_the_pass_goes_on() -> None:
    """torch.fx allows a tensor as an argument itself (a graph built by hand): no node to route
    the users to, so that dropout stays; the one after it still goes."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    kept = graph.call_function(F.dropout, (torch.ones(3),), {"p": 0.5, "training": False})
    removed = graph.call_function(F.dropout, (x,), {"p": 0.5, "training": False})
    graph.output(graph.call_function(torch.add, (kept, removed)))
    gm = fx.GraphModule(nn.Module(), graph)
    result = RemoveDropout().call(gm, FxContext())
    assert (result.rewrites, result.skips) == (1, {"dropout input is not a tensor node": 1})
    assert count_calls(gm, F.dropout) == 1
    x_value = torch.randn(3)
    assert torch.equal(fx.Interpreter(gm).run(x_value), x_value + 1)
