"""RemoveIdentity: nn.Identity always; x+0 / x*1 forms only when the dtype provably stays."""

from __future__ import annotations

import operator
from collections.abc import Mapping

import pytest
import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from fxmobile.passes.remove_identity import RemoveIdentity
from fxmobile.passes.stage import FxContext
from tests.helpers import assert_equivalent, count_calls, count_modules


class Arith(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 0
        y = 0 + y
        y = y - 0
        y = y * 1
        y = 1 * y
        y = y / 1
        y = y.add(0).mul(1.0)
        return torch.add(y, 0) + 1


def _run(model: nn.Module, *example: torch.Tensor) -> tuple[fx.GraphModule, int, Mapping[str, int]]:
    gm = fx.symbolic_trace(model)
    if example:
        ShapeProp(gm).propagate(*example)
    result = RemoveIdentity().call(gm, FxContext())
    gm.graph.lint()
    gm.recompile()
    return gm, result.rewrites, result.skips


def test_identity_module_removed_without_shapes() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Identity(), nn.Identity()).eval()
    gm, rewrites, _ = _run(model)
    assert rewrites == 2 and count_modules(gm, nn.Identity) == 0
    assert_equivalent(model, gm, torch.randn(2, 3))


def test_neutral_arithmetic_removed_for_float_input() -> None:
    x = torch.randn(2, 3)
    gm, rewrites, _ = _run(Arith(), x)
    assert rewrites == 9
    assert count_calls(gm, operator.add) == 1  # only `+ 1` is left
    assert_equivalent(Arith(), gm, x)


def test_neutral_arithmetic_needs_shapes() -> None:
    _, rewrites, skips = _run(Arith())
    assert rewrites == 0
    assert skips == {"input dtype unknown (pass example_inputs)": 9}


RETURNED = "x or the result is written in place, or returned (x + 0 is a copy)"
PROMOTING_SKIPS = {
    # bool: every scalar promotes; `* 1` of the float sum is returned, so it stays a copy
    torch.bool: {"scalar would promote torch.bool": 3, RETURNED: 1},
    torch.int32: {
        "scalar would promote torch.int32": 1,  # x + 0.0
        RETURNED: 1,  # (x + 0.0) * 1
        "integer true division changes dtype": 2,  # x / 1, x.div(1)
    },
}


@pytest.mark.parametrize("dtype", list(PROMOTING_SKIPS))
def test_promoting_forms_are_kept(dtype: torch.dtype) -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (x + 0.0) * 1, x / 1, x.div(1)

    x = torch.ones(3, dtype=dtype)
    gm, rewrites, skips = _run(M(), x)
    for got, expected in zip(gm(x), M()(x), strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert (rewrites, skips) == (0, PROMOTING_SKIPS[dtype])


class ZeroTimesAlpha(nn.Module):
    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.add(x, 0, alpha=self.alpha)
        y = torch.sub(y, 0, alpha=self.alpha)
        return y.add(0, alpha=self.alpha) * 2


def test_an_add_of_zero_with_a_finite_alpha_is_removed() -> None:
    x = torch.randn(4)
    gm, rewrites, skips = _run(ZeroTimesAlpha(3.0), x)
    assert (rewrites, skips) == (3, {})
    assert_equivalent(ZeroTimesAlpha(3.0), gm, x)


@pytest.mark.parametrize("alpha", [float("inf"), float("nan")])
def test_regression_an_add_of_zero_with_an_infinite_alpha_is_kept(alpha: float) -> None:
    """``x + inf * 0`` is nan, not x: the pass removed it, and the module returned finite
    values where eager returned nan (the gate caught it; with ``check="off"`` it was handed
    back). Found by the full mutation run (the "alpha" keyword's name mutated survived)."""
    model = ZeroTimesAlpha(alpha)
    x = torch.randn(4)
    gm, rewrites, skips = _run(model, x)
    assert (rewrites, skips) == (0, {"alpha is not a finite number (x + inf * 0 is nan)": 3})
    assert bool(gm(x).isnan().all()) and bool(model(x).isnan().all())


class KeywordIdentity(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.identity = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.identity(input=x) * 2


def test_an_identity_called_by_keyword_is_left_as_it_is() -> None:
    x = torch.randn(3)
    gm, rewrites, skips = _run(KeywordIdentity(), x)
    assert (rewrites, skips) == (0, {})
    assert_equivalent(KeywordIdentity(), gm, x)


def test_non_neutral_and_rounding_division_kept() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.div(x, 1, rounding_mode="floor") + (0 - x) + x * 2

    x = torch.randn(4) * 3
    gm, rewrites, _ = _run(M(), x)
    assert rewrites == 0
    assert_equivalent(M(), gm, x)


class CopyThenInPlace(nn.Module):
    """Found by the fuzzer: without the copy ``x + 0`` makes, relu_ would write to the input."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.act(x + 0), x * 1


def test_identity_whose_copy_is_written_or_returned_is_kept() -> None:
    x = torch.randn(1, 1, 3)
    gm, rewrites, skips = _run(CopyThenInPlace(), x)
    assert rewrites == 0
    assert skips == {"x or the result is written in place, or returned (x + 0 is a copy)": 2}
    given = x.clone()
    _, same = gm(given)
    assert torch.equal(given, x) and same is not given


class InputWrittenLater(nn.Module):
    """Found by the fuzzer: the copy must survive a later in-place write to its source."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 0
        torch.relu_(x)
        return y * 2


def test_identity_whose_source_is_written_later_is_kept() -> None:
    x = torch.randn(2, 3)
    gm, rewrites, _ = _run(InputWrittenLater(), x)
    assert rewrites == 0
    assert torch.equal(gm(x.clone()), InputWrittenLater()(x.clone()))


class SourceWrittenByAModule(nn.Module):
    """The write to the copy's source is an in-place module, found only through the graph
    module (a mutant that dropped it survived every test)."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 1.5
        y = h + 0
        self.act(h)
        return y * 2 + h


def test_identity_whose_source_an_inplace_module_writes_is_kept() -> None:
    x = torch.randn(2, 3)
    gm, rewrites, _ = _run(SourceWrittenByAModule(), x)
    assert rewrites == 0
    assert torch.equal(gm(x.clone()), SourceWrittenByAModule()(x.clone()))


class BoolArithmetic(nn.Module):
    """``x * 1`` on a bool tensor is an int64 tensor: ``~`` then flips bits, not truth."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return ~(x * 1), (x + 0) - 1, torch.mul(x, 1).sum()


def test_neutral_integer_arithmetic_on_bool_is_kept() -> None:
    x = torch.tensor([True, False, True])
    gm, rewrites, skips = _run(BoolArithmetic(), x)
    assert rewrites == 0
    assert skips == {"scalar would promote torch.bool": 3}
    for got, expected in zip(gm(x), BoolArithmetic()(x), strict=True):
        assert got.dtype == expected.dtype == torch.int64
        assert torch.equal(got, expected)
    assert torch.equal(gm(x)[0], torch.tensor([-2, -1, -2]))  # not [False, True, False]
