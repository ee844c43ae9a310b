"""The shared matchers (``fxmobile.passes.matchers``): BatchNorm calls and the producers they
follow.

``fold_batchnorm`` and ``decompose_batchnorm`` both take a BatchNorm through ``match_batchnorm``,
and ``fold_batchnorm`` and ``fold_conv_arithmetic`` both take a producer through
``match_producer``, so the cases they must refuse are checked through each pass that uses them:
same reason, graph left alone. Some
graphs here are built by hand, because tracing ``F.batch_norm`` always writes out every argument
(its defaults, a tensor as a literal argument) and a pass must still read such a graph right.
"""

from __future__ import annotations

import copy
import operator
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from fxmobile.infra import PassResult
from fxmobile.passes.decompose_batchnorm import DecomposeBatchNorm
from fxmobile.passes.fold_batchnorm import FoldBatchNorm
from fxmobile.passes.fold_conv_arithmetic import FoldConvArithmetic
from fxmobile.passes.stage import FxContext, FxPass
from tests.helpers import assert_equivalent, count_calls, count_modules, randomize_batchnorm

PASSES = [FoldBatchNorm, DecomposeBatchNorm]
PRODUCER_PASSES = [FoldBatchNorm, FoldConvArithmetic]


def run(
    gm: fx.GraphModule, pass_type: type[FxPass], *inputs: torch.Tensor
) -> PassResult[fx.GraphModule]:
    """``pass_type`` on ``gm`` (shape-propagated from ``inputs`` if any), then lint, recompile."""
    if inputs:
        ShapeProp(gm).propagate(*inputs)
    result = pass_type().call(gm, FxContext())
    gm.graph.lint()
    gm.recompile()
    return result


def hand_built(bn_input: str, kwargs: dict[str, Any]) -> fx.GraphModule:
    """``F.batch_norm(<bn_input>, mean, var, **kwargs)`` after ``F.conv2d(x, w, b)``, written
    by hand; ``bn_input`` is ``"conv"`` or ``"literal"`` (a tensor as the argument itself)."""
    gen = torch.Generator().manual_seed(0)
    root = nn.Module()
    root.register_buffer("w", torch.randn(4, 3, 3, 3, generator=gen))
    root.register_buffer("b", torch.randn(4, generator=gen))
    root.register_buffer("mean", torch.randn(4, generator=gen))
    # variances below eps: a wrong eps shows in the numbers
    root.register_buffer("var", torch.rand(4, generator=gen) * 1e-6)
    graph = fx.Graph()
    x = graph.placeholder("x")
    conv = graph.call_function(F.conv2d, (x, graph.get_attr("w"), graph.get_attr("b")))
    source: Any = conv if bn_input == "conv" else torch.ones(1, 4, 2, 2)
    mean, var = graph.get_attr("mean"), graph.get_attr("var")
    bn = graph.call_function(F.batch_norm, (source, mean, var), kwargs)
    graph.output(bn)
    return fx.GraphModule(root, graph)


@pytest.mark.parametrize("pass_type", PASSES, ids=lambda p: p.__name__)
def test_batch_norm_with_training_and_eps_left_to_their_defaults_is_rewritten(
    pass_type: type[FxPass],
) -> None:
    # F.batch_norm(x, mean, var) is inference (training=False) with eps=1e-5
    gm = hand_built("conv", {})
    reference = copy.deepcopy(gm)
    x = torch.randn(2, 3, 6, 6)

    result = run(gm, pass_type, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_calls(gm, F.batch_norm) == 0
    assert_equivalent(reference, gm, x)


class NotConstantFlags(nn.Module):
    """``F.batch_norm`` whose ``eps`` or ``training`` is computed from the input."""

    mean: torch.Tensor
    var: torch.Tensor

    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which
        self.conv = nn.Conv2d(3, 4, 3)
        self.register_buffer("mean", torch.randn(4))
        self.register_buffer("var", torch.rand(4) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.which == "eps":
            return F.batch_norm(y, self.mean, self.var, eps=x.shape[0] * 1e-5)
        return F.batch_norm(y, self.mean, self.var, training=x.shape[0] > 100)


@pytest.mark.parametrize("pass_type", PASSES, ids=lambda p: p.__name__)
@pytest.mark.parametrize("which", ["eps", "training"])
def test_batch_norm_whose_eps_or_training_flag_is_computed_is_left_alone(
    which: str, pass_type: type[FxPass]
) -> None:
    # a training flag that is a node may be True when the model runs, an eps node any value
    model = NotConstantFlags(which).eval()
    gm = fx.symbolic_trace(model)
    x = torch.randn(2, 3, 6, 6)

    result = run(gm, pass_type, x)

    assert (result.rewrites, result.skips) == (
        0,
        {"BN training flag or eps is not a constant": 1},
    )
    assert count_calls(gm, F.batch_norm) == 1
    assert_equivalent(model, gm, x)


class OneRunningStat(nn.Module):
    """``F.batch_norm`` in eval given only one of ``running_mean`` / ``running_var``."""

    stat: torch.Tensor

    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which
        self.conv = nn.Conv2d(3, 4, 3)
        self.register_buffer("stat", torch.rand(4) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.which == "mean":
            return F.batch_norm(y, self.stat, None, training=False)
        return F.batch_norm(y, None, self.stat, training=False)


@pytest.mark.parametrize("pass_type", PASSES, ids=lambda p: p.__name__)
@pytest.mark.parametrize("which", ["mean", "var"])
def test_batch_norm_with_one_running_stat_is_left_alone(
    which: str, pass_type: type[FxPass]
) -> None:
    # torch refuses it when it runs; a rewrite would make a model that runs (or crash the pass)
    model = OneRunningStat(which).eval()
    gm = fx.symbolic_trace(model)
    x = torch.randn(2, 3, 6, 6)
    with pytest.raises(RuntimeError, match="must be defined in evaluation mode"):
        model(x)

    result = run(gm, pass_type)

    assert (result.rewrites, result.skips) == (0, {"BN has no running stats": 1})
    assert count_calls(gm, F.batch_norm) == 1
    with pytest.raises(RuntimeError, match="must be defined in evaluation mode"):
        gm(x)


@pytest.mark.parametrize("pass_type", PASSES, ids=lambda p: p.__name__)
def test_batch_norm_of_a_literal_tensor_is_left_alone(pass_type: type[FxPass]) -> None:
    # torch.fx allows a tensor as an argument itself (no node); the matcher cannot follow it
    gm = hand_built("literal", {"training": False, "eps": 1e-5})

    result = run(gm, pass_type)

    assert (result.rewrites, result.skips) == (0, {"BN input is not a tensor node": 1})
    assert count_calls(gm, F.batch_norm) == 1


class TwoFunctionalBatchNorms(nn.Module):
    """Two ``F.batch_norm`` of the same rank with different statistics, after no producer."""

    mean1: torch.Tensor
    var1: torch.Tensor
    mean2: torch.Tensor
    var2: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        for i in (1, 2):
            self.register_buffer(f"mean{i}", torch.randn(4, generator=gen))
            self.register_buffer(f"var{i}", torch.rand(4, generator=gen) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.batch_norm(torch.relu(x), self.mean1, self.var1)
        return F.batch_norm(torch.relu(y), self.mean2, self.var2)


def test_each_functional_batch_norm_is_decomposed_with_its_own_statistics() -> None:
    # the decomposition stores s and t per (BN name, rank): each functional BN needs its own name
    model = TwoFunctionalBatchNorms().eval()
    gm = fx.symbolic_trace(model)
    x = torch.randn(2, 4, 5, 5)

    result = run(gm, DecomposeBatchNorm, x)

    assert (result.rewrites, result.skips) == (2, {})
    assert count_calls(gm, F.batch_norm) == 0
    assert_equivalent(model, gm, x)


class ModuleWithOneRunningStat(nn.Module):
    """``bn(conv(x))`` where one of the BatchNorm module's running stats was set to None."""

    def __init__(self, which: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = randomize_batchnorm(nn.BatchNorm2d(4), seed=5)
        setattr(self.bn, f"running_{which}", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


@pytest.mark.parametrize("pass_type", PASSES, ids=lambda p: p.__name__)
@pytest.mark.parametrize("which", ["mean", "var"])
def test_batchnorm_module_with_one_running_stat_is_left_alone(
    which: str, pass_type: type[FxPass]
) -> None:
    # With one stat None the module still calls batch_norm in eval mode, which torch refuses.
    model = ModuleWithOneRunningStat(which).eval()
    gm = fx.symbolic_trace(model)
    x = torch.randn(2, 3, 6, 6)
    with pytest.raises(RuntimeError, match="must be defined in evaluation mode"):
        model(x)

    result = run(gm, pass_type)

    assert (result.rewrites, result.skips) == (0, {"BN has no running stats": 1})
    assert count_modules(gm, nn.BatchNorm2d) == 1


def _hooked_bn() -> nn.Module:
    bn = nn.BatchNorm2d(4)
    bn.register_forward_hook(lambda m, i, o: o.abs())
    return bn


def _doubled(self: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    return nn.BatchNorm2d.forward(self, x) * 2


def _bn_with_its_own_forward() -> nn.Module:
    bn = nn.BatchNorm2d(4)
    bn.forward = types.MethodType(_doubled, bn)  # type: ignore[method-assign]
    return bn


@pytest.mark.parametrize("pass_type", PASSES, ids=lambda p: p.__name__)
@pytest.mark.parametrize(
    "make,reason",
    [
        (_hooked_bn, "BatchNorm2d has forward hooks"),
        (_bn_with_its_own_forward, "BatchNorm2d instance has a forward of its own"),
    ],
    ids=["hook", "instance_forward"],
)
def test_batchnorm_module_that_runs_more_than_its_forward_is_left_alone(
    make: Callable[[], nn.Module], reason: str, pass_type: type[FxPass]
) -> None:
    # calling the module runs the hook or the instance's forward too: a rewrite would drop it
    model = randomize_batchnorm(nn.Sequential(nn.Conv2d(3, 4, 3), make()), seed=8).eval()
    gm = fx.symbolic_trace(model)
    x = torch.randn(2, 3, 6, 6)

    result = run(gm, pass_type, x)

    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert count_modules(gm, nn.BatchNorm2d) == 1
    assert_equivalent(model, gm, x)


class BatchNormByKeyword(nn.Module):
    """``self.bn(input=conv(x))``: fx keeps the keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(input=self.conv(x))


@pytest.mark.parametrize("pass_type", PASSES, ids=lambda p: p.__name__)
def test_batchnorm_module_called_by_keyword_is_rewritten(pass_type: type[FxPass]) -> None:
    model = randomize_batchnorm(BatchNormByKeyword(), seed=9).eval()
    gm = fx.symbolic_trace(model)
    x = torch.randn(2, 3, 6, 6)

    result = run(gm, pass_type, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_modules(gm, nn.BatchNorm2d) == 0
    assert_equivalent(model, gm, x)


@pytest.mark.parametrize("pass_type", PASSES, ids=lambda p: p.__name__)
def test_batchnorm_module_of_a_literal_tensor_is_left_alone(pass_type: type[FxPass]) -> None:
    # ``bn(<a tensor literal>) + x`` by hand: no node to follow (such a graph runs only through
    # fx.Interpreter, as its generated code cannot print the literal)
    root = nn.Module()
    root.bn = randomize_batchnorm(nn.BatchNorm2d(4), seed=10).eval()
    graph = fx.Graph()
    x = graph.placeholder("x")
    literal = torch.randn(1, 4, 2, 2, generator=torch.Generator().manual_seed(10))
    graph.output(graph.call_function(torch.add, (graph.call_module("bn", (literal,)), x)))
    gm = fx.GraphModule(root, graph)
    reference = copy.deepcopy(gm)

    result = run(gm, pass_type)

    assert (result.rewrites, result.skips) == (0, {"BN input is not a tensor node": 1})
    assert count_modules(gm, nn.BatchNorm2d) == 1
    x_value = torch.randn(1, 4, 2, 2)
    assert_equivalent(fx.Interpreter(reference).run, fx.Interpreter(gm).run, x_value)


# ---------------------------------------------------------------------------- producers


class FunctionalProducerThen(nn.Module):
    """``fn(x, w, b)`` (with ``which`` of w and b computed, or none), then a BatchNorm or a
    per-channel multiply: the two folds that take a producer through ``match_producer``."""

    def __init__(self, kind: str, which: str, then: str, **kwargs: Any) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(6)
        self.kind, self.which, self.then, self.kwargs = kind, which, then, kwargs
        shape = {"linear": (6, 5), "conv2d": (6, 3, 3, 3), "conv_transpose2d": (3, 6, 3, 3)}
        self.w = nn.Parameter(torch.randn(*shape[kind], generator=gen))
        self.b = nn.Parameter(torch.randn(6, generator=gen))
        self.bn = randomize_batchnorm(nn.BatchNorm1d(6) if kind == "linear" else nn.BatchNorm2d(6))
        self.register_buffer("c", torch.randn(6, *[1] * (kind != "linear") * 2, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w.abs() if self.which == "weight" else self.w
        b = self.b.abs() if self.which == "bias" else self.b
        y = getattr(F, self.kind)(x, w, b, **self.kwargs)
        return self.bn(y) if self.then == "bn" else y * self.c


PRODUCER_INPUTS = {
    "linear": (4, 5),
    "conv2d": (2, 3, 5, 5),
    "conv_transpose2d": (2, 3, 4, 4),
}


def then_for(pass_type: type[FxPass]) -> str:
    return "bn" if pass_type is FoldBatchNorm else "mul"


@pytest.mark.parametrize("pass_type", PRODUCER_PASSES, ids=lambda p: p.__name__)
@pytest.mark.parametrize("which", ["weight", "bias"])
@pytest.mark.parametrize("kind", ["linear", "conv2d"])
def test_functional_producer_with_a_computed_weight_or_bias_is_left_alone(
    kind: str, which: str, pass_type: type[FxPass]
) -> None:
    # A computed weight or bias is no constant to fold into; the reason names the producer kind.
    model = randomize_batchnorm(FunctionalProducerThen(kind, which, then_for(pass_type))).eval()
    gm = fx.symbolic_trace(model)
    x = torch.randn(*PRODUCER_INPUTS[kind])

    result = run(gm, pass_type, x)

    name = "linear" if kind == "linear" else "conv"
    reason = f"functional {name} weight or bias is not a get_attr tensor"
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert count_calls(gm, getattr(F, kind)) == 1
    assert_equivalent(model, gm, x)


@pytest.mark.parametrize("pass_type", PRODUCER_PASSES, ids=lambda p: p.__name__)
def test_functional_transposed_conv_without_a_groups_argument_folds(
    pass_type: type[FxPass],
) -> None:
    # groups defaults to 1: out channels = weight.shape[1] * 1 = 6 (the kernel is 3)
    model = FunctionalProducerThen("conv_transpose2d", "none", then_for(pass_type), stride=2)
    model = randomize_batchnorm(model).eval()
    gm = fx.symbolic_trace(model)
    x = torch.randn(*PRODUCER_INPUTS["conv_transpose2d"])

    result = run(gm, pass_type, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_modules(gm, nn.BatchNorm2d) == 0 and count_calls(gm, operator.mul) == 0
    assert_equivalent(model, gm, x)


class UnbatchedFunctionalConv1d(nn.Module):
    """``bn(F.conv1d(x, w))`` on an unbatched ``[C, L]`` input: the output is ``[C', L']``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3))
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(F.conv1d(x, self.w))


def test_unbatched_functional_conv_is_refused_with_its_name() -> None:
    # [3, 6] -> F.conv1d -> [4, 4]: the BN normalizes the length; the reason names the function.
    model = randomize_batchnorm(UnbatchedFunctionalConv1d(), seed=7).eval()
    gm = fx.symbolic_trace(model)
    x = torch.randn(3, 6)

    result = run(gm, FoldBatchNorm, x)

    reason = "F.conv1d output is 2-D: BN normalizes dim 1, not its channels"
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert count_modules(gm, nn.BatchNorm1d) == 1
    assert_equivalent(model, gm, x)
