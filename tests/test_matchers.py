"""The shared BatchNorm matcher (``fxmobile.passes.matchers``) on the functional form.

``fold_batchnorm`` and ``decompose_batchnorm`` both take a BatchNorm through ``match_batchnorm``,
so the cases it must refuse are checked through both passes: same reason, graph left alone. Some
graphs here are built by hand, because tracing ``F.batch_norm`` always writes out every argument
(its defaults, a tensor as a literal argument) and a pass must still read such a graph right.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from fxmobile.infra import PassResult
from fxmobile.passes.decompose_batchnorm import DecomposeBatchNorm
from fxmobile.passes.fold_batchnorm import FoldBatchNorm
from fxmobile.passes.stage import FxContext, FxPass
from tests.helpers import assert_equivalent, count_calls

PASSES = [FoldBatchNorm, DecomposeBatchNorm]


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
