"""FoldConvArithmetic: constant add/sub/mul/div after a conv / transposed conv / linear."""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules.conv import _ConvNd

from fxmobile.infra import PassResult
from fxmobile.passes.fold_conv_arithmetic import FoldConvArithmetic
from fxmobile.passes.stage import FxContext
from tests.helpers import assert_equivalent, count_calls, count_modules, run_fx_passes

CONVS: dict[tuple[int, bool], Callable[..., _ConvNd]] = {
    (1, False): nn.Conv1d,
    (2, False): nn.Conv2d,
    (3, False): nn.Conv3d,
    (1, True): nn.ConvTranspose1d,
    (2, True): nn.ConvTranspose2d,
    (3, True): nn.ConvTranspose3d,
}
C = 6  # output channels of every conv here


class ConvThen(nn.Module):
    """``fn(self, conv(x))``; ``self.c`` is the constant (a buffer) when one is given."""

    def __init__(
        self,
        fn: Callable[[Any, torch.Tensor], Any],
        c: torch.Tensor | None = None,
        conv: _ConvNd | None = None,
    ) -> None:
        super().__init__()
        self.conv: _ConvNd = conv if conv is not None else nn.Conv2d(4, C, 3, bias=True)
        self.fn = fn
        if c is not None:
            self.register_buffer("c", c)

    def forward(self, x: torch.Tensor) -> Any:
        return self.fn(self, self.conv(x))


def per_channel(*trailing: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A positive constant, distinct per channel: shape ``[C, *trailing]``."""
    gen = torch.Generator().manual_seed(1)
    return (torch.rand(C, *trailing, generator=gen) + 0.5).to(dtype)


def x_for(dim: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 4, *[5] * dim, generator=torch.Generator().manual_seed(2))


def run(model: nn.Module, x: torch.Tensor | None = None) -> tuple[fx.GraphModule, PassResult]:
    """Trace ``model`` and run the pass, with shapes from ``x`` when given."""
    gm = fx.symbolic_trace(model)
    if x is None:
        result = FoldConvArithmetic().call(gm, FxContext())
        gm.graph.lint()
        gm.recompile()
        return gm, result
    gm, records = run_fx_passes(gm, [FoldConvArithmetic()], (x,))
    (record,) = records
    return gm, PassResult(gm, record.rewrites, record.skips)


ARITH_TARGETS = (
    *(operator.add, operator.sub, operator.mul, operator.truediv),
    *(torch.add, torch.sub, torch.mul, torch.div, "add", "sub", "mul", "div"),
)


def count_arith(gm: fx.GraphModule) -> int:
    return sum(count_calls(gm, t) for t in ARITH_TARGETS)


# --- every operation and operand order that folds ---------------------------------------------

OPS: dict[str, Callable[[Any, torch.Tensor], torch.Tensor]] = {
    "y + c": lambda m, y: y + m.c,
    "y - c": lambda m, y: y - m.c,
    "y * c": lambda m, y: y * m.c,
    "y / c": lambda m, y: y / m.c,
    "c + y": lambda m, y: m.c + y,
    "c * y": lambda m, y: m.c * y,
    "torch.add(y, c, alpha=2)": lambda m, y: torch.add(y, m.c, alpha=2),
    "torch.add(c, y, alpha=-1.5)": lambda m, y: torch.add(m.c, y, alpha=-1.5),
    "torch.sub(y, c, alpha=0.5)": lambda m, y: torch.sub(y, m.c, alpha=0.5),
    "torch.mul(c, y)": lambda m, y: torch.mul(m.c, y),
    "torch.div(y, c)": lambda m, y: torch.div(y, m.c),
    "torch.div(y, c, rounding_mode=None)": lambda m, y: torch.div(y, m.c, rounding_mode=None),
    "y.add(c)": lambda m, y: y.add(m.c),
    "y.sub(c, alpha=3)": lambda m, y: y.sub(m.c, alpha=3),
    "y.mul(c)": lambda m, y: y.mul(m.c),
    "y.div(c)": lambda m, y: y.div(m.c),
    "c.mul(y)": lambda m, y: m.c.mul(y),
    "y * 2.5 (scalar)": lambda m, y: y * 2.5,
    "3 + y (scalar)": lambda m, y: 3 + y,
    "y / -4 (scalar)": lambda m, y: y / -4,
    "y - 1 (scalar)": lambda m, y: y - 1,
}


@pytest.mark.parametrize("op", OPS)
def test_each_operation_folds(op: str) -> None:
    model = ConvThen(OPS[op], per_channel(1, 1)).eval()
    reference, x = copy.deepcopy(model), x_for(2)
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (1, {})
    assert count_arith(gm) == 0
    assert count_modules(gm, nn.Conv2d) == 1
    assert_equivalent(reference, gm, x)


# --- every conv kind, groups > 1, bias on and off -------------------------------------------


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize(("dim", "transposed"), list(CONVS), ids=lambda v: str(v))
def test_chain_folds_into_every_conv_kind(dim: int, transposed: bool, bias: bool) -> None:
    conv = CONVS[(dim, transposed)](4, C, 3, groups=2, bias=bias)
    c = per_channel(*[1] * dim)
    model = ConvThen(lambda m, y: (y * m.c + 1) / 3 - m.c, c, conv).eval()
    reference, x = copy.deepcopy(model), x_for(dim)
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (4, {})
    assert count_arith(gm) == 0
    assert count_modules(gm, type(conv)) == 1
    assert_equivalent(reference, gm, x)
    folded = gm.get_submodule(next(n.target for n in gm.graph.nodes if n.op == "call_module"))
    assert folded.bias is not None and folded.bias.dtype == torch.float32  # gained one if needed
    assert reference.conv.weight.equal(conv.weight)  # the original conv is untouched


# --- constant shapes and kinds -----------------------------------------------------------------

CONSTANTS: dict[str, torch.Tensor | float] = {
    "python scalar": 1.75,
    "0-dim tensor": torch.tensor(1.75),
    "0-dim float64 tensor (does not promote)": torch.tensor(1.75, dtype=torch.float64),
    "[1]": torch.tensor([1.75]),
    "[1, 1, 1]": torch.full((1, 1, 1), 1.75),
    "[C, 1, 1]": per_channel(1, 1),
    "float16 [C, 1, 1] (does not promote)": per_channel(1, 1, dtype=torch.float16),
}


@pytest.mark.parametrize("name", CONSTANTS)
def test_constant_kinds_fold_without_shapes(name: str) -> None:
    value = CONSTANTS[name]
    if isinstance(value, torch.Tensor):
        model = ConvThen(lambda m, y: y * m.c - m.c, value).eval()
    else:
        model = ConvThen(lambda m, y: y * value - value).eval()
    reference, x = copy.deepcopy(model), x_for(2)
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (2, {})
    assert count_arith(gm) == 0
    assert_equivalent(reference, gm, x)
    assert all(p.dtype == torch.float32 for p in gm.parameters())


@pytest.mark.parametrize("shape", [(1, C, 1, 1), (1, 1, 1, 1)], ids=str)
def test_batched_rank_constant_needs_shapes(shape: tuple[int, ...]) -> None:
    # [1, C, 1, 1] against an unbatched [C, H, W] output would add a dim: only the output's
    # rank (from shape propagation) tells the two apart.
    c = per_channel(1, 1).reshape(shape) if shape[1] == C else torch.full(shape, 0.5)
    model = ConvThen(lambda m, y: y + m.c, c).eval()
    reference, x = copy.deepcopy(model), x_for(2)

    gm, result = run(model)
    assert (result.rewrites, result.skips) == (0, {"shape unknown (pass example_inputs)": 1})
    assert count_arith(gm) == 1

    gm, result = run(model, x)
    assert (result.rewrites, result.skips) == (1, {})
    assert count_arith(gm) == 0
    assert_equivalent(reference, gm, x)

    unbatched = x[0]
    gm, result = run(model, unbatched)
    reason = "constant has more dims than the conv output"
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert_equivalent(reference, gm, unbatched)


def test_unbatched_conv_with_per_channel_constant_folds() -> None:
    model = ConvThen(lambda m, y: y * m.c, per_channel(1, 1)).eval()
    reference, x = copy.deepcopy(model), x_for(2)[0]
    gm, result = run(model)
    assert result.rewrites == 1
    assert_equivalent(reference, gm, x)


def test_keeps_a_float64_conv_float64() -> None:
    model = ConvThen(lambda m, y: y / m.c, per_channel(1, 1)).double().eval()
    model.c = per_channel(1, 1)  # float32 constant: float64 output stays float64
    reference, x = copy.deepcopy(model), x_for(2).double()
    gm, result = run(model)
    assert result.rewrites == 1
    assert all(p.dtype == torch.float64 for p in gm.parameters())
    assert_equivalent(reference, gm, x, rel=1e-12)


# --- sharing -----------------------------------------------------------------------------------


class SharedConv(nn.Module):
    c: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, C, 3)
        self.register_buffer("c", per_channel(1, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.conv(x) * self.c, self.conv(x), self.conv(x) + 1


def test_shared_conv_is_not_mutated() -> None:
    model = SharedConv().eval()
    reference, x = copy.deepcopy(model), x_for(2)
    weight = model.conv.weight.detach().clone()
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (2, {})
    targets = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert len(set(targets)) == 3 and "conv" in targets  # two new modules, the plain site kept
    kept = gm.get_submodule("conv")
    assert isinstance(kept, nn.Conv2d) and kept.weight.equal(weight)
    assert model.conv.weight.equal(weight)
    assert_equivalent(reference, gm, x)


# --- linear and functional producers -----------------------------------------------------------


class LinearThen(nn.Module):
    def __init__(self, c: torch.Tensor) -> None:
        super().__init__()
        self.fc = nn.Linear(5, C)
        self.register_buffer("c", c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (2 * self.fc(x) + self.c) / self.c


@pytest.mark.parametrize("shape", [(C,), (1,), (1, C)], ids=str)
def test_linear_per_feature_constant_folds(shape: tuple[int, ...]) -> None:
    model = LinearThen(per_channel().reshape(shape) if C in shape else torch.tensor([0.5])).eval()
    reference, x = copy.deepcopy(model), torch.randn(3, 5)
    gm, result = run(model, x)
    assert (result.rewrites, result.skips) == (3, {})
    assert count_arith(gm) == 0 and count_modules(gm, nn.Linear) == 1
    assert_equivalent(reference, gm, x)


def test_linear_constant_over_rows_is_left_alone() -> None:
    model = LinearThen(torch.rand(3, 1) + 0.5).eval()
    x = torch.randn(3, 5)
    gm, result = run(model, x)
    assert (result.rewrites, result.skips) == (1, {"constant varies over the batch dim": 1})
    assert_equivalent(model, gm, x)


class FunctionalConv(nn.Module):
    c: torch.Tensor

    def __init__(self, transposed: bool, bias: bool) -> None:
        super().__init__()
        self.transposed = transposed
        shape = (4, C // 2, 3, 3) if transposed else (C, 2, 3, 3)
        self.w = nn.Parameter(torch.randn(shape) * 0.2)
        self.b = nn.Parameter(torch.randn(C)) if bias else None
        self.register_buffer("c", per_channel(1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.transposed:
            y = F.conv_transpose2d(x, self.w, self.b, groups=2)
        else:
            y = F.conv2d(x, self.w, self.b, 1, 0, 1, 2)
        return self.c * y + self.c


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("transposed", [False, True], ids=["conv2d", "conv_transpose2d"])
def test_functional_conv_folds(transposed: bool, bias: bool) -> None:
    model = FunctionalConv(transposed, bias).eval()
    reference, x = copy.deepcopy(model), x_for(2)
    target = F.conv_transpose2d if transposed else F.conv2d
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (2, {})
    assert count_arith(gm) == 0 and count_calls(gm, target) == 1
    assert model.w.equal(reference.w)
    assert not hasattr(gm, "w") and not hasattr(gm, "b")  # the old constants are dropped
    assert_equivalent(reference, gm, x)


class KeywordProducer(nn.Module):
    """``producer(x, ...) * c + c`` with the weight or bias passed by keyword."""

    c: torch.Tensor

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.w = nn.Parameter(torch.randn((C, 4) if how == "linear" else (C, 4, 3, 3)) * 0.2)
        self.b = nn.Parameter(torch.randn(C))
        self.register_buffer("c", per_channel() if how == "linear" else per_channel(1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "linear":
            y = F.linear(x, weight=self.w, bias=self.b)
        elif self.how == "conv bias=None":
            y = F.conv2d(x, self.w, bias=None)
        else:
            y = F.conv2d(x, self.w, bias=self.b)
        return y * self.c + self.c


@pytest.mark.parametrize("how", ["linear", "conv bias=None", "conv bias=b"])
def test_functional_producer_with_keyword_weight_or_bias_folds(how: str) -> None:
    # fx keeps arguments as written: the folded weight and bias must replace the keywords (the
    # argument right after the positional ones included), not be appended positionally.
    model = KeywordProducer(how).eval()
    x = torch.randn(3, 4) if how == "linear" else x_for(2)
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (2, {})
    assert count_arith(gm) == 0 and count_calls(gm, F.linear if how == "linear" else F.conv2d) == 1
    assert not hasattr(gm, "w") and not hasattr(gm, "b")
    assert_equivalent(model, gm, x)


class SharedFunctionalWeight(nn.Module):
    """Two ``F.conv2d`` reading the same weight and bias (one ``get_attr`` node each in fx); only
    the first is followed by a constant."""

    c: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(C, 4, 3, 3) * 0.2)
        self.b = nn.Parameter(torch.randn(C))
        self.register_buffer("c", per_channel(1, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.conv2d(x, self.w, self.b) * self.c, F.conv2d(x, self.w, self.b)


def test_functional_conv_sharing_its_weight_leaves_it_to_the_other_conv() -> None:
    model = SharedFunctionalWeight().eval()
    reference, x = copy.deepcopy(model), x_for(2)
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (1, {})
    assert count_arith(gm) == 0 and count_calls(gm, F.conv2d) == 2
    kept = gm.get_parameter("w"), gm.get_parameter("b")  # still read by the second conv
    assert kept[0].equal(reference.w) and kept[1].equal(reference.b)
    assert_equivalent(reference, gm, x)


def test_functional_conv_with_computed_weight_is_left_alone() -> None:
    class Computed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(C, 4, 3, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.conv2d(x, self.w.abs()) * 2

    _, result = run(Computed().eval())
    assert result.rewrites == 0
    assert result.skips == {"functional conv weight or bias is not a get_attr tensor": 1}


# --- left alone, with the reason ---------------------------------------------------------------

PROMOTES = "constant would promote the conv output from torch.float32 to"
NEGATIVE: dict[str, tuple[Callable[[Any, torch.Tensor], Any], Any, str]] = {
    "spatial [1, 1, H, W]": (
        lambda m, y: y * m.c,
        torch.rand(1, 1, 3, C) + 0.5,
        "constant varies over spatial dims",
    ),
    "[C] broadcasts over W": (
        lambda m, y: y + m.c,
        per_channel(),
        "constant varies over spatial dims",
    ),
    "tensor with a zero in division": (
        lambda m, y: y / m.c,
        torch.tensor([1.0, 2.0, 0.0, 3.0, 4.0, 5.0]).reshape(C, 1, 1),
        "division by a constant with a zero",
    ),
    "scalar zero division": (lambda m, y: y / 0.0, None, "division by a constant with a zero"),
    "c - y": (
        lambda m, y: m.c - y,
        per_channel(1, 1),
        "constant minus conv output (c - y) is not folded",
    ),
    "c / y": (
        lambda m, y: torch.div(m.c, y),
        per_channel(1, 1),
        "constant divided by conv output (c / y) is not affine",
    ),
    "two users": (lambda m, y: (y * m.c, y.relu()), per_channel(1, 1), "conv output has 2 users"),
    "float64 constant promotes": (
        lambda m, y: y + m.c,
        per_channel(1, 1, dtype=torch.float64),
        f"{PROMOTES} torch.float64",
    ),
    "complex scalar promotes": (lambda m, y: y * 1j, None, f"{PROMOTES} torch.complex64"),
    "rank 5 constant": (
        lambda m, y: y * m.c,
        per_channel(1, 1).reshape(1, 1, C, 1, 1),
        "constant has more dims than the conv output",
    ),
    "rounding_mode": (
        lambda m, y: torch.div(y, m.c, rounding_mode="floor"),
        per_channel(1, 1),
        "division with a rounding_mode",
    ),
    "infinite scalar": (lambda m, y: y * float("inf"), None, "constant is not finite"),
    # scale inf: inf * w summed over a window of mixed signs is nan where eager gives +-inf
    "infinite alpha": (
        lambda m, y: torch.add(m.c, y, alpha=float("inf")),
        per_channel(1, 1),
        "alpha is not a finite number",
    ),
}


@pytest.mark.parametrize("case", NEGATIVE)
def test_left_alone_with_reason(case: str) -> None:
    fn, c, reason = NEGATIVE[case]
    model = ConvThen(fn, c).eval()
    x = torch.randn(2, 4, 5, C + 2)  # output width C: a [C] constant broadcasts over W
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert count_arith(gm) == 1
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["conv"]
    with torch.no_grad():
        expected, got = model(x), gm(x)
    torch.testing.assert_close(got, expected, equal_nan=True, rtol=0, atol=0)


def test_batch_varying_constant_is_left_alone() -> None:
    model = ConvThen(lambda m, y: y - m.c, torch.rand(2, C, 1, 1)).eval()
    x = x_for(2)
    gm, result = run(model, x)
    assert (result.rewrites, result.skips) == (0, {"constant varies over the batch dim": 1})
    assert_equivalent(model, gm, x)


def test_constant_that_widens_a_one_channel_output_is_left_alone() -> None:
    """A conv with one output channel times a constant of C channels broadcasts its output up to
    C channels: no fold into one channel of weights says that."""
    model = ConvThen(lambda m, y: y * m.c, per_channel(1, 1), nn.Conv2d(4, 1, 3)).eval()
    x = x_for(2)
    gm, result = run(model, x)
    assert (result.rewrites, result.skips) == (0, {f"constant has {C} channels, conv has 1": 1})
    assert_equivalent(model, gm, x)


def test_commuted_add_with_alpha_scales_the_shift_before_it() -> None:
    """``c + alpha * (y + 1)``: the shift the chain has so far is scaled by alpha too."""
    model = ConvThen(lambda m, y: torch.add(m.c, y + 1, alpha=2), per_channel(1, 1)).eval()
    reference, x = copy.deepcopy(model), x_for(2)
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (2, {})
    assert count_arith(gm) == 0
    assert_equivalent(reference, gm, x)


class ThreeConvsOneWeight(nn.Module):
    """One weight, three functional convs, each scaled by its own constant."""

    a: torch.Tensor
    b: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(C, 4, 3, 3))
        self.register_buffer("a", per_channel(1, 1))
        self.register_buffer("b", per_channel(1, 1) * 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        w = self.w
        return F.conv2d(x, w) * self.a, F.conv2d(x + 1, w) * self.b, F.conv2d(x - 1, w) * 3


def test_folds_into_one_weight_get_a_folded_weight_each() -> None:
    """Each fold registers its own weight under the next free name (the second one would
    otherwise overwrite the first's)."""
    model = ThreeConvsOneWeight().eval()
    reference, x = copy.deepcopy(model), x_for(2)
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (3, {})
    weights = [n.args[1].target for n in gm.graph.nodes if n.target is torch.conv2d]
    assert weights == ["w_folded", "w_folded_1", "w_folded_2"]
    assert_equivalent(reference, gm, x)


@pytest.mark.filterwarnings("ignore:Attempted to insert a get_attr Node")  # the case itself
def test_a_get_attr_that_is_not_a_tensor_is_left_alone() -> None:
    """A graph built by hand (the pass takes any GraphModule) may read a Python number with
    get_attr; only tensors and literals fold."""
    model = ConvThen(lambda m, y: y * 2.0).eval()
    gm = fx.symbolic_trace(model)
    vars(gm)["k"] = 2.0  # a plain attribute, neither parameter nor buffer
    mul = next(n for n in gm.graph.nodes if n.target is operator.mul)
    with gm.graph.inserting_before(mul):
        mul.args = (mul.args[0], gm.graph.get_attr("k"))
    gm.recompile()
    result = FoldConvArithmetic().call(gm, FxContext())
    assert (result.rewrites, result.skips) == (0, {"constant get_attr is not a tensor": 1})
    x = x_for(2)
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)


class HookedThenPlain(nn.Module):
    c: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.hooked, self.plain = nn.Conv2d(4, C, 3), nn.Conv2d(C, C, 3)
        self.hooked.register_forward_hook(lambda module, args, out: out + 1)
        self.register_buffer("c", per_channel(1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.plain(self.hooked(x) * self.c) * self.c


def test_a_refused_producer_does_not_stop_the_folds_after_it() -> None:
    model = HookedThenPlain().eval()
    reference, x = copy.deepcopy(model), x_for(2)
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (1, {"producer module: Conv2d has forward hooks": 1})
    assert count_arith(gm) == 1
    assert_equivalent(reference, gm, x)


def test_chain_folds_up_to_the_first_unfoldable_step() -> None:
    # torch.ones(...) in forward is traced into a get_attr constant (_tensor_constant0).
    fn = lambda m, y: (y * 2 + 1) * torch.ones(1, 1, 3, 3) + m.c  # noqa: E731
    model = ConvThen(fn, per_channel(1, 1)).eval()
    reference, x = copy.deepcopy(model), x_for(2)
    gm, result = run(model)
    assert (result.rewrites, result.skips) == (2, {"constant varies over spatial dims": 1})
    assert count_arith(gm) == 2
    assert_equivalent(reference, gm, x)


def test_residual_add_is_not_a_candidate() -> None:
    model = ConvThen(lambda m, y: y + y.sigmoid()).eval()
    _, result = run(model)
    assert (result.rewrites, result.skips) == (0, {})


# --- end to end through the manager ------------------------------------------------------------


def test_end_to_end_through_pass_manager() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.ConvTranspose2d(4, C, 3, groups=2, bias=False)
            self.register_buffer("scale", per_channel(1, 1).reshape(1, C, 1, 1))
            self.fc = nn.Linear(7, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = (self.conv(x) * self.scale + 1.0) / 2
            return self.fc(y) - 0.5

    model = Net().eval()
    reference, x = copy.deepcopy(model), x_for(2)
    gm = fx.symbolic_trace(model)
    gm, records = run_fx_passes(gm, [FoldConvArithmetic()], (x,))
    assert [(r.name, r.rewrites, r.skips) for r in records] == [("fold_conv_arithmetic", 4, {})]
    assert count_arith(gm) == 0
    assert count_modules(gm, nn.ConvTranspose2d) == 1 and count_modules(gm, nn.Linear) == 1
    assert "scale" not in dict(gm.named_buffers())  # unused constants are dropped
    for _ in range(2):  # run the optimized model more than once (pytorch#52463)
        assert_equivalent(reference, gm, x)
