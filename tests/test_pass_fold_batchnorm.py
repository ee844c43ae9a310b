"""FoldBatchNorm: BN folded into conv / transposed conv / linear, and the cases it must refuse."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from fxmobile.infra import PassResult
from fxmobile.passes.fold_batchnorm import FoldBatchNorm
from fxmobile.passes.stage import FxContext
from tests.helpers import (
    assert_equivalent,
    count_calls,
    count_modules,
    randomize_batchnorm,
    run_fx_passes,
    trace_keeping,
)

CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
CONV_TS = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
BNS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
UNKNOWN = "shape unknown (pass example_inputs)"


def fold(
    model: nn.Module,
    *inputs: torch.Tensor,
    shapes: bool = True,
    leaves: tuple[type[nn.Module], ...] = (),
) -> tuple[fx.GraphModule, PassResult]:
    """Trace a copy of ``model`` (shape-propagated from ``inputs`` unless told not to), fold."""
    model = copy.deepcopy(model)
    gm = trace_keeping(model, *leaves)
    if shapes and inputs:
        ShapeProp(gm).propagate(*inputs)
    result = FoldBatchNorm().call(gm, FxContext())
    gm.graph.lint()
    gm.recompile()
    return gm, result


def spatial_input(channels: int, dims: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(2, channels, *([5, 4, 3][:dims]), dtype=dtype)


def eval_model(*layers: nn.Module, seed: int = 0) -> nn.Sequential:
    return randomize_batchnorm(nn.Sequential(*layers), seed).eval()


def only_producer(gm: fx.GraphModule, kind: type[nn.Module]) -> nn.Module:
    (node,) = (
        n
        for n in gm.graph.nodes
        if n.op == "call_module" and type(gm.get_submodule(n.target)) is kind
    )
    return gm.get_submodule(node.target)


# ---------------------------------------------------------------------------- module form


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "conv_t"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
# (in, out, groups): dense, grouped, depthwise, depthwise with channel multiplier
@pytest.mark.parametrize("cin,cout,groups", [(4, 6, 1), (4, 6, 2), (4, 4, 4), (4, 8, 4)])
def test_conv_module_folds(
    dims: int, transposed: bool, bias: bool, cin: int, cout: int, groups: int
) -> None:
    torch.manual_seed(dims * 10 + groups)
    if transposed:
        conv: nn.Module = CONV_TS[dims](
            cin, cout, 3, stride=2, padding=1, output_padding=1, groups=groups, bias=bias
        )
    else:
        conv = CONVS[dims](cin, cout, 3, padding=1, groups=groups, bias=bias)
    eps = {1: 1e-5, 2: 1e-3, 3: 0.1}[dims]
    model = eval_model(conv, BNS[dims](cout, eps=eps), seed=groups + dims)
    x = spatial_input(cin, dims)

    gm, result = fold(model, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_modules(gm, BNS[dims]) == 0
    folded = only_producer(gm, type(conv))
    assert folded.bias is not None and folded.bias.dtype == torch.float32  # gained one (#127227)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in gm.modules())
    assert_equivalent(model, gm, x)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_linear_on_2d_input_folds(bias: bool) -> None:
    model = eval_model(nn.Linear(5, 6, bias=bias), nn.BatchNorm1d(6, eps=1e-3), seed=3)
    x = torch.randn(4, 5)

    gm, result = fold(model, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_modules(gm, nn.BatchNorm1d) == 0
    assert only_producer(gm, nn.Linear).bias is not None
    assert_equivalent(model, gm, x)


class FlattenThenLinear(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(12, 6)
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "module":
            x = self.flatten(x)
        elif self.how == "function":
            x = torch.flatten(x, 1)
        elif self.how == "method":
            x = x.flatten(1)
        elif self.how == "view":
            x = x.view(x.size(0), -1)
        elif self.how == "view_tuple":  # the sizes as one tuple: view(*args[1:][0])
            x = x.view((x.size(0), -1))
        elif self.how == "reshape_list":
            x = x.reshape([x.size(0), -1])
        else:
            x = torch.reshape(x, (x.size(0), -1))
        return self.bn(self.fc(x))


@pytest.mark.parametrize(
    "how", ["module", "function", "method", "view", "view_tuple", "reshape_list", "torch.reshape"]
)
def test_linear_after_flatten_folds_without_shapes(how: str) -> None:
    # flatten(x, 1) / view(n, -1) is 2-D, so the Linear's features are dim 1: provable.
    model = randomize_batchnorm(FlattenThenLinear(how), seed=4).eval()
    x = torch.randn(3, 3, 2, 2)

    gm, result = fold(model, x, shapes=False)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_modules(gm, nn.BatchNorm1d) == 0
    assert_equivalent(model, gm, x)


class FlattenThenLinearCall(nn.Module):
    """``bn(linear(flatten(x, 1)))`` with the linear called by keyword or as ``F.linear``."""

    def __init__(self, call: str) -> None:
        super().__init__()
        self.call = call
        self.fc = nn.Linear(12, 6)
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        if self.call == "module_keyword":
            y = self.fc(input=x)
        elif self.call == "function":
            y = F.linear(x, self.fc.weight, self.fc.bias)
        else:
            y = F.linear(input=x, weight=self.fc.weight, bias=self.fc.bias)
        return self.bn(y)


@pytest.mark.parametrize("call", ["module_keyword", "function", "function_keyword"])
def test_linear_called_by_keyword_or_functionally_after_flatten_folds_without_shapes(
    call: str,
) -> None:
    # The rank proof follows the Linear's input however it is passed: flatten(x, 1) is 2-D.
    model = randomize_batchnorm(FlattenThenLinearCall(call), seed=4).eval()
    x = torch.randn(3, 3, 2, 2)

    gm, result = fold(model, x, shapes=False)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_modules(gm, nn.BatchNorm1d) == 0
    assert_equivalent(model, gm, x)


class UnprovenRankThenLinear(nn.Module):
    """``bn(fc(f(x)))`` with ``f`` a call that proves no rank: every case gives ``[2, 6, 4]``,
    then Linear -> ``[2, 6, 6]``, and BatchNorm1d(6) runs over dim 1, not the features."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.fc = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "transpose":  # [2, 4, 6]: a method call with ints, like view(n, -1)
            x = x.transpose(1, 2)
        elif self.how == "tile":  # [2, 3, 4]: two arguments, like torch.reshape(x, shape)
            x = torch.tile(x, (2, 1))
        elif self.how == "flatten_1_2":  # [2, 2, 3, 4]: flatten up to a dim that is not the last
            x = torch.flatten(x, 1, 2)
        else:  # [2, 6, 2, 2]: flatten from a dim counted from the end
            x = torch.flatten(x, -2)
        return self.bn(self.fc(x))


UNPROVEN_INPUTS = {
    "transpose": (2, 4, 6),
    "tile": (2, 3, 4),
    "flatten_1_2": (2, 2, 3, 4),
    "flatten_from_-2": (2, 6, 2, 2),
}


@pytest.mark.parametrize("shapes", [False, True], ids=["no_shapes", "shapes"])
@pytest.mark.parametrize("how", list(UNPROVEN_INPUTS))
def test_linear_after_a_call_that_proves_no_rank_is_not_guessed(how: str, shapes: bool) -> None:
    # Only flatten(x, start >= 0) to the last dim and view/reshape prove a rank. Taking these for
    # a 2-D input would fold the BN's dim-1 scale into the Linear's features.
    model = randomize_batchnorm(UnprovenRankThenLinear(how), seed=26).eval()
    x = torch.randn(*UNPROVEN_INPUTS[how])

    gm, result = fold(model, x, shapes=shapes)

    reason = "Linear output is 3-D: BN normalizes dim 1, not its channels" if shapes else UNKNOWN
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert count_modules(gm, nn.BatchNorm1d) == 1
    assert_equivalent(model, gm, x)


def linear_of_a_literal() -> fx.GraphModule:
    """``F.batch_norm(F.linear(<a tensor literal>, w, b), mean, var) + x``, written by hand:
    torch.fx allows a tensor as an argument itself, which tracing would make a get_attr. (Its
    generated code cannot print the literal: such a graph runs through ``fx.Interpreter``.)"""
    gen = torch.Generator().manual_seed(27)
    root = nn.Module()
    for name, shape in (("w", (6, 4)), ("b", (6,)), ("mean", (6,))):
        root.register_buffer(name, torch.randn(*shape, generator=gen))
    root.register_buffer("var", torch.rand(6, generator=gen) + 0.1)
    graph = fx.Graph()
    x = graph.placeholder("x")
    literal = torch.randn(2, 4, generator=gen)
    y = graph.call_function(F.linear, (literal, graph.get_attr("w"), graph.get_attr("b")))
    mean, var = graph.get_attr("mean"), graph.get_attr("var")
    bn = graph.call_function(F.batch_norm, (y, mean, var), {"training": False, "eps": 1e-5})
    graph.output(graph.call_function(torch.add, (bn, x)))
    return fx.GraphModule(root, graph)


@pytest.mark.parametrize("shapes", [False, True], ids=["no_shapes", "shapes"])
def test_linear_of_a_literal_tensor_is_folded_only_with_shapes(shapes: bool) -> None:
    # Without shapes there is no node to follow to prove the literal's rank.
    gm = linear_of_a_literal()
    reference = copy.deepcopy(gm)
    x = torch.randn(2, 6)
    if shapes:
        ShapeProp(gm).propagate(x)

    result = FoldBatchNorm().call(gm, FxContext())
    gm.graph.lint()
    gm.recompile()

    assert (result.rewrites, result.skips) == ((1, {}) if shapes else (0, {UNKNOWN: 1}))
    assert count_calls(gm, F.batch_norm) == (0 if shapes else 1)
    assert_equivalent(fx.Interpreter(reference).run, fx.Interpreter(gm).run, x)


class FlattenFromDim2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(torch.flatten(x, 2)))


def test_linear_after_flatten_from_dim_2_is_proven_3d() -> None:
    # [2, 6, 2, 2] -> flatten(x, 2) -> [2, 6, 4] -> Linear(4, 6) -> [2, 6, 6]: BN1d runs on dim 1.
    model = randomize_batchnorm(FlattenFromDim2(), seed=4).eval()
    x = torch.randn(2, 6, 2, 2)

    gm, result = fold(model, x, shapes=False)

    reason = "Linear output is 3-D: BN normalizes dim 1, not its channels"
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert_equivalent(model, gm, x)


class LinearAfterView(nn.Module):
    """``bn(fc(x.view(size)))`` with one argument to ``view``: a single size, a whole shape or a
    dtype; or ``bn(fc(x.flatten()))``, flattened from dim 0."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.fc = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "one size":
            x = x.view(-1)
        elif self.how == "flatten":
            x = torch.flatten(x)  # start_dim defaults to 0: 1-D
        elif self.how == "flatten method":
            x = x.flatten()
        elif self.how == "a shape":
            x = x.view(x.shape)  # a node holding a whole torch.Size
        else:
            x = x.view(torch.float32)  # a dtype, not a size
        return self.bn(self.fc(x))


@pytest.mark.parametrize("how", ["a shape", "dtype"])
def test_a_view_to_a_shape_or_a_dtype_proves_no_rank(how: str) -> None:
    # view(s) with s a node may be view(torch.Size) of any rank, and view(dtype) keeps the rank:
    # without shapes the Linear's output rank is unknown, however the model is called.
    model = randomize_batchnorm(LinearAfterView(how), seed=4).eval()
    x = torch.randn(3, 4)

    gm, result = fold(model, x, shapes=False)

    assert (result.rewrites, result.skips) == (0, {UNKNOWN: 1})
    assert count_modules(gm, nn.BatchNorm1d) == 1
    assert torch.equal(gm(x), model(x))  # left alone (a float64 reference would view(float32))


@pytest.mark.parametrize("how", ["one size", "flatten", "flatten method"])
def test_a_view_or_flatten_to_one_dim_is_refused_as_1d(how: str) -> None:
    # view(-1) and flatten() (start_dim 0) flatten the batch too: the Linear's output is 1-D,
    # which no BatchNorm takes. The reason says so (the model cannot run), rather than asking for
    # example inputs.
    model = randomize_batchnorm(LinearAfterView(how), seed=4).eval()
    with pytest.raises(ValueError, match="expected 2D or 3D input"):
        model(torch.randn(4))

    gm, result = fold(model, shapes=False)

    reason = "Linear output is 1-D: BN normalizes dim 1, not its channels"
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert count_modules(gm, nn.BatchNorm1d) == 1


def test_sync_batchnorm_folds_like_batchnorm_in_eval() -> None:
    model = eval_model(nn.Conv2d(3, 4, 3), nn.SyncBatchNorm(4), seed=5)
    x = spatial_input(3, 2)

    gm, result = fold(model, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_modules(gm, nn.SyncBatchNorm) == 0
    assert_equivalent(model, gm, x)


def test_batchnorm_without_affine_folds() -> None:
    model = eval_model(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4, affine=False), seed=6)
    x = spatial_input(3, 2)

    gm, result = fold(model, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_modules(gm, nn.BatchNorm2d) == 0
    assert_equivalent(model, gm, x)


@pytest.mark.parametrize("eps", [1e-5, 1e-3, 0.5])
def test_eps_is_honoured_when_var_is_tiny(eps: float) -> None:
    bn = nn.BatchNorm2d(4, eps=eps)
    model = eval_model(nn.Conv2d(3, 4, 3), bn, seed=7)
    assert bn.running_var is not None
    with torch.no_grad():
        bn.running_var.copy_(torch.rand(4) * 1e-4)
    x = spatial_input(3, 2)

    gm, result = fold(model, x)

    assert result.rewrites == 1
    assert_equivalent(model, gm, x)


# ---------------------------------------------------------------------------- dtypes (#76578)

# rel = 4 units of roundoff of the dtype (float16 2**-11, bfloat16 2**-8); eager half itself is
# 1-2 units off the float64 anchor on these models, the folded model 1-2.5 units.
DTYPES = [(torch.float64, 1e-12), (torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)]


@pytest.mark.parametrize("dtype,rel", DTYPES, ids=["f64", "f16", "bf16"])
@pytest.mark.parametrize("kind", ["conv", "conv_t", "linear"])
def test_producer_dtype_is_kept(dtype: torch.dtype, rel: float, kind: str) -> None:
    torch.manual_seed(8)
    if kind == "conv":
        producer: nn.Module = nn.Conv2d(4, 6, 3, groups=2, bias=False)
        bn: nn.Module = nn.BatchNorm2d(6)
        x = spatial_input(4, 2)
    elif kind == "conv_t":
        producer, bn, x = (
            nn.ConvTranspose2d(4, 8, 3, groups=4),
            nn.BatchNorm2d(8),
            spatial_input(4, 2),
        )
    else:
        producer, bn, x = nn.Linear(5, 6), nn.BatchNorm1d(6), torch.randn(4, 5)
    model = eval_model(producer, bn, seed=9).to(dtype)
    x = x.to(dtype)

    gm, result = fold(model, x)

    assert result.rewrites == 1
    folded = only_producer(gm, type(producer))
    assert folded.weight.dtype == dtype and folded.bias is not None and folded.bias.dtype == dtype
    with torch.no_grad():
        assert gm(x).dtype == dtype
    assert_equivalent(model, gm, x, rel=rel)


# ---------------------------------------------------------------------------- functional form

FUNCTIONS: list[tuple[Callable[..., Any], type[nn.Module], int, dict[str, Any]]] = [
    (F.conv1d, nn.Conv1d, 1, {"padding": 1, "groups": 2}),
    (F.conv2d, nn.Conv2d, 2, {"padding": 1, "groups": 2}),
    (F.conv3d, nn.Conv3d, 3, {"padding": 1, "groups": 2}),
    (F.conv_transpose1d, nn.ConvTranspose1d, 1, {"stride": 2, "groups": 2}),
    (F.conv_transpose2d, nn.ConvTranspose2d, 2, {"stride": 2, "groups": 2}),
    (F.conv_transpose3d, nn.ConvTranspose3d, 3, {"stride": 2, "groups": 2}),
    (F.linear, nn.Linear, 0, {}),
]


class FunctionalProducerBN(nn.Module):
    """``F.batch_norm(fn(x, W, b, **kwargs), <stats of bn>)`` with W, b taken from ``layer``."""

    def __init__(
        self, fn: Callable[..., Any], layer: nn.Module, bn: nn.BatchNorm1d, **kw: Any
    ) -> None:
        super().__init__()
        self.fn, self.kw, self.bn = fn, kw, bn
        self.weight = layer.weight
        self.bias = layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fn(x, self.weight, self.bias, **self.kw)
        bn: nn.BatchNorm1d = self.bn
        return F.batch_norm(
            y, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.1, bn.eps
        )


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("fn,layer,dims,kw", FUNCTIONS, ids=lambda v: getattr(v, "__name__", ""))
def test_functional_producer_and_bn_fold(
    fn: Callable[..., Any], layer: type[nn.Module], dims: int, kw: dict[str, Any], bias: bool
) -> None:
    torch.manual_seed(dims)
    args = (4, 6) if layer is nn.Linear else (4, 6, 3)
    producer = layer(*args, bias=bias, **({"groups": 2} if kw else {}))
    model = FunctionalProducerBN(fn, producer, nn.BatchNorm1d(6, eps=1e-3), **kw)
    randomize_batchnorm(model, seed=dims).eval()
    x = torch.randn(3, 4) if dims == 0 else spatial_input(4, dims)

    gm, result = fold(model, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_calls(gm, F.batch_norm) == 0 and count_calls(gm, fn) == 1
    assert not hasattr(gm, "bn") and not hasattr(gm, "weight")  # old constants dropped
    assert_equivalent(model, gm, x)


class KeywordProducerBN(nn.Module):
    """A functional producer whose weight or bias is passed by keyword, then a BatchNorm."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.weight = nn.Parameter(torch.randn(6, 4) if how == "linear" else torch.randn(6, 4, 3))
        self.bias = nn.Parameter(torch.randn(6))
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "linear":
            y = F.linear(x, weight=self.weight, bias=self.bias)
        elif self.how == "conv bias=None":
            y = F.conv1d(x, self.weight, bias=None)
        else:
            y = F.conv1d(x, self.weight, bias=self.bias)
        return self.bn(y)


@pytest.mark.parametrize("how", ["linear", "conv bias=None", "conv bias=b"])
def test_functional_producer_with_keyword_weight_or_bias_folds(how: str) -> None:
    # fx keeps arguments as written: the folded weight and bias must replace the keywords (the
    # argument right after the positional ones included), not be appended positionally.
    model = randomize_batchnorm(KeywordProducerBN(how), seed=5).eval()
    x = torch.randn(3, 4) if how == "linear" else torch.randn(2, 4, 7)
    fn = F.linear if how == "linear" else F.conv1d

    gm, result = fold(model, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_modules(gm, nn.BatchNorm1d) == 0 and count_calls(gm, fn) == 1
    assert not hasattr(gm, "weight") and not hasattr(gm, "bias")  # old constants dropped
    assert_equivalent(model, gm, x)


class ModuleConvFunctionalBN(nn.Module):
    mean: torch.Tensor
    var: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.register_buffer("mean", torch.randn(4))
        self.register_buffer("var", torch.rand(4) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(self.conv(x), self.mean, self.var, eps=1e-3)  # no gamma / beta


class FunctionalConvModuleBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 2, 3, 3))
        self.bn = nn.BatchNorm2d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(F.conv2d(x, self.weight, None, 1, 1, 1, 2))  # groups given positionally


@pytest.mark.parametrize("model_cls", [ModuleConvFunctionalBN, FunctionalConvModuleBN])
def test_mixed_module_and_functional_forms_fold(model_cls: type[nn.Module]) -> None:
    torch.manual_seed(10)
    model = randomize_batchnorm(model_cls(), seed=10).eval()
    x = spatial_input(3 if model_cls is ModuleConvFunctionalBN else 4, 2)

    gm, result = fold(model, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert count_calls(gm, F.batch_norm) == 0 and count_modules(gm, nn.BatchNorm2d) == 0
    assert_equivalent(model, gm, x)


class FunctionalBNVariant(nn.Module):
    mean: torch.Tensor
    var: torch.Tensor

    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant = variant
        self.conv = nn.Conv2d(3, 4, 3)
        self.register_buffer("mean", torch.randn(4))
        self.register_buffer("var", torch.rand(4) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.variant == "training":
            return F.batch_norm(y, self.mean, self.var, training=True)
        # stats computed from the data are not constants
        return F.batch_norm(y, y.detach().mean((0, 2, 3)), self.var)


@pytest.mark.parametrize(
    "variant,reason",
    [
        ("training", "BN in training mode"),
        ("dynamic", "BN stats or affine params are not constants"),
    ],
)
def test_functional_bn_that_is_not_inference_is_left_alone(variant: str, reason: str) -> None:
    x = spatial_input(3, 2)
    gm, result = fold(FunctionalBNVariant(variant).eval(), x)

    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert count_calls(gm, F.batch_norm) == 1


# ---------------------------------------------------------------------------- channel axis


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("table", [CONVS, CONV_TS], ids=["conv", "conv_t"])
def test_bn_rank_check_proves_batched_conv_without_shapes(
    dims: int, table: dict[int, type[nn.Module]]
) -> None:
    # BatchNorm2d/3d accept only 4-D/5-D input, so the conv output is batched: dim 1 = channels.
    model = eval_model(table[dims](3, 4, 3), BNS[dims](4), seed=11)
    x = spatial_input(3, dims)

    gm, result = fold(model, x, shapes=False)

    assert (result.rewrites, result.skips) == (1, {})
    assert_equivalent(model, gm, x)


def test_conv1d_needs_shapes_because_unbatched_output_is_2d() -> None:
    # An unbatched Conv1d gives [C, L], where BatchNorm1d normalizes L: only shapes can tell.
    model = eval_model(nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4), seed=12)
    gm, result = fold(model, spatial_input(3, 1), shapes=False)

    assert (result.rewrites, result.skips) == (0, {UNKNOWN: 1})
    assert count_modules(gm, nn.BatchNorm1d) == 1


def test_unbatched_conv1d_is_not_folded() -> None:
    # [3, 6] -> Conv1d -> [4, 4]: BatchNorm1d(4) runs, over dim 1 (length), not the channels.
    model = eval_model(nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4), seed=13)
    x = torch.randn(3, 6)

    gm, result = fold(model, x)

    reason = "Conv1d output is 2-D: BN normalizes dim 1, not its channels"
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert_equivalent(model, gm, x)


def test_linear_on_3d_input_is_not_folded() -> None:
    # [2, 6, 5] -> Linear(5, 6) -> [2, 6, 6]: BatchNorm1d(6) runs over dim 1, not the features.
    model = eval_model(nn.Linear(5, 6), nn.BatchNorm1d(6), seed=14)
    x = torch.randn(2, 6, 5)

    gm, result = fold(model, x)

    reason = "Linear output is 3-D: BN normalizes dim 1, not its channels"
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert count_modules(gm, nn.BatchNorm1d) == 1
    assert_equivalent(model, gm, x)


def test_linear_without_shapes_is_not_guessed() -> None:
    model = eval_model(nn.Linear(5, 6), nn.BatchNorm1d(6), seed=15)
    gm, result = fold(model, torch.randn(4, 5), shapes=False)

    assert (result.rewrites, result.skips) == (0, {UNKNOWN: 1})
    assert count_modules(gm, nn.BatchNorm1d) == 1


@pytest.mark.parametrize("shapes", [False, True], ids=["no_shapes", "shapes"])
def test_linear_before_a_batchnorm_of_any_rank_folds_only_with_shapes(shapes: bool) -> None:
    # SyncBatchNorm takes any rank and a Linear gives any rank: nothing narrows it down.
    model = eval_model(nn.Linear(5, 6), nn.SyncBatchNorm(6), seed=28)
    x = torch.randn(4, 5)

    gm, result = fold(model, x, shapes=shapes)

    assert (result.rewrites, result.skips) == ((1, {}) if shapes else (0, {UNKNOWN: 1}))
    assert count_modules(gm, nn.SyncBatchNorm) == (0 if shapes else 1)
    assert_equivalent(model, gm, x)


def test_conv_before_a_batchnorm_that_takes_no_rank_it_gives_is_refused() -> None:
    # Conv1d gives 2-D or 3-D, BatchNorm2d takes only 4-D: the model cannot run, and the reason
    # says that no rank fits rather than asking for example inputs.
    model = eval_model(nn.Conv1d(3, 4, 3), nn.BatchNorm2d(4), seed=29)
    with pytest.raises(ValueError, match="expected 4D input"):
        model(torch.randn(2, 3, 6))

    gm, result = fold(model, shapes=False)

    reason = "Conv1d output is ?-D: BN normalizes dim 1, not its channels"
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert count_modules(gm, nn.BatchNorm2d) == 1


def test_linear_before_batchnorm2d_is_refused_without_shapes() -> None:
    # BatchNorm2d forces a 4-D Linear output, whose features are dim 3, never dim 1.
    model = eval_model(nn.Linear(4, 3), nn.BatchNorm2d(3), seed=16)
    x = torch.randn(2, 3, 5, 4)

    gm, result = fold(model, x, shapes=False)

    reason = "Linear output is 4-D: BN normalizes dim 1, not its channels"
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert_equivalent(model, gm, x)


@pytest.mark.parametrize(
    "producer,bn,reason",
    [
        (
            nn.Conv2d(3, 6, 3),
            nn.BatchNorm2d(8),
            "BN has 8 features, producer has 6 output channels",
        ),
        (nn.Linear(5, 6), nn.BatchNorm1d(8), "BN has 8 features, producer has 6 output channels"),
        (
            nn.ConvTranspose2d(4, 6, 3, groups=2),
            nn.BatchNorm2d(3),
            "BN has 3 features, producer has 6 output channels",
        ),
    ],
)
def test_mismatched_features_are_not_folded(
    producer: nn.Module, bn: nn.Module, reason: str
) -> None:
    gm, result = fold(eval_model(producer, bn))

    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert count_modules(gm, type(bn)) == 1


# ---------------------------------------------------------------------------- shared modules


class SharedConv(nn.Module):
    """One conv called at two sites; only the first, or both, followed by a BN."""

    def __init__(self, bn_at_both: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.bn2 = nn.BatchNorm2d(4) if bn_at_both else nn.Identity()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.bn1(self.conv(x)), self.bn2(self.conv(x * 2))


@pytest.mark.parametrize("bn_at_both", [False, True], ids=["bn_once", "bn_twice"])
def test_shared_conv_is_never_mutated(bn_at_both: bool) -> None:
    model = randomize_batchnorm(SharedConv(bn_at_both), seed=17).eval()
    x = spatial_input(3, 2)
    gm = fx.symbolic_trace(copy.deepcopy(model))
    shared = gm.get_submodule("conv")
    assert isinstance(shared, nn.Conv2d)
    weight_before = shared.weight.detach().clone()

    result = FoldBatchNorm().call(gm, FxContext())
    gm.recompile()

    assert (result.rewrites, result.skips) == (1 + bn_at_both, {})
    assert count_modules(gm, nn.BatchNorm2d) == 0
    assert torch.equal(shared.weight, weight_before) and shared.bias is None
    targets = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    if not bn_at_both:  # the plain site still calls the untouched module
        assert targets[:2] == ["conv_bn_folded", "conv"] and gm.conv is shared
    assert_equivalent(model, gm, x)


def test_conv_called_once_is_replaced_at_its_own_path() -> None:
    # Nothing else reaches the conv: the folded conv takes its place and name, no copy is kept.
    model = eval_model(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), seed=23)
    x = spatial_input(3, 2)

    gm, result = fold(model, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["0"]
    assert [name for name, _ in gm.named_modules()] == ["", "0"]
    folded, original = only_producer(gm, nn.Conv2d), model[0]
    assert isinstance(folded, nn.Conv2d) and isinstance(original, nn.Conv2d)
    assert not torch.equal(folded.weight, original.weight)  # the folded one, not a copy
    assert_equivalent(model, gm, x)


class ReadsConvTensor(nn.Module):
    """``bn(conv(x))`` scaled by a statistic of the conv's own weight or bias (a get_attr)."""

    def __init__(self, tensor: str) -> None:
        super().__init__()
        self.tensor = tensor
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) * getattr(self.conv, self.tensor).abs().mean()


@pytest.mark.parametrize("tensor", ["weight", "bias"])
def test_conv_whose_tensor_is_also_read_keeps_it_unfolded(tensor: str) -> None:
    # ``conv.weight`` read by get_attr must still see the conv's own weight, not the folded one.
    model = randomize_batchnorm(ReadsConvTensor(tensor), seed=24).eval()
    x = spatial_input(3, 2)

    gm, result = fold(model, x)

    assert (result.rewrites, result.skips) == (1, {})
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["conv_bn_folded"]
    assert torch.equal(getattr(gm.conv, tensor), getattr(model.conv, tensor))
    assert_equivalent(model, gm, x)


class ThreeSites(nn.Module):
    """One conv called at three sites, each followed by a BatchNorm of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bns = nn.ModuleList(nn.BatchNorm2d(4) for _ in range(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(bn(self.conv(x + i)) for i, bn in enumerate(self.bns))


def test_each_fold_of_a_conv_shared_by_three_batchnorms_gets_its_own_module() -> None:
    # The first two folds are installed beside the shared conv (it is still called after them),
    # each under a fresh name: a second "conv_bn_folded" would replace the first site's module.
    model = randomize_batchnorm(ThreeSites(), seed=25).eval()
    x = spatial_input(3, 2)

    gm, result = fold(model, x)

    assert (result.rewrites, result.skips) == (3, {})
    targets = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert targets == ["conv_bn_folded", "conv_bn_folded_1", "conv"]
    assert count_modules(gm, nn.BatchNorm2d) == 0
    assert_equivalent(model, gm, x)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).relu()


class CallsInsideOfLeaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) + self.bn(self.block.conv(x))


def test_conv_inside_a_leaf_module_is_not_replaced_in_place() -> None:
    model = randomize_batchnorm(CallsInsideOfLeaf(), seed=18).eval()
    x = spatial_input(3, 2)

    gm, result = fold(model, x, leaves=(Block,))

    assert result.rewrites == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert targets == ["block", "block_conv_bn_folded"]
    assert_equivalent(model, gm, x)


class TwoPaths(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = Block(), Block()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.a.conv(x)) + self.b.conv(x)


def test_conv_reachable_through_an_aliased_parent_is_not_replaced_in_place() -> None:
    gm = fx.symbolic_trace(randomize_batchnorm(TwoPaths(), seed=19).eval())
    gm.b = gm.a  # "a.conv" and "b.conv" are now one module reached by two paths
    reference = copy.deepcopy(gm)
    conv = gm.get_submodule("a.conv")
    assert isinstance(conv, nn.Conv2d)
    weight_before = conv.weight.detach().clone()
    x = spatial_input(3, 2)

    result = FoldBatchNorm().call(gm, FxContext())
    gm.recompile()

    assert result.rewrites == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert targets == ["a_conv_bn_folded", "b.conv"]
    assert gm.get_submodule("b.conv") is conv and torch.equal(conv.weight, weight_before)
    assert_equivalent(reference, gm, x)


# ---------------------------------------------------------------------------- refusals


class TwoUsers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.bn(y) + y


class AssertedRank(nn.Module):
    """timm's ``BatchNormAct2d``: asserts its input's rank before normalizing it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        torch._assert(y.ndim == 4, "expected 4D input")
        return self.bn(y).reshape(y.shape[0], y.size(1), -1)


class ShapeAndValues(nn.Module):
    """Reads the conv output's shape and, in the same call, its values."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.bn(y) + y.new_ones(y.size()) * y


class MyConv(nn.Conv2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


class MyBN(nn.BatchNorm2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).abs()


def _hooked_conv() -> nn.Module:
    conv = nn.Conv2d(3, 4, 3)
    conv.register_forward_hook(lambda m, i, o: o * 2)
    return conv


def _training_bn_model() -> nn.Module:
    model = eval_model(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    model[1].train()
    return model


@pytest.mark.parametrize(
    "make,reason",
    [
        (lambda: randomize_batchnorm(TwoUsers()).eval(), "producer output has 2 users"),
        (
            lambda: eval_model(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False)),
            "BN has no running stats",
        ),
        (_training_bn_model, "BN in training mode"),
        (
            lambda: eval_model(MyConv(3, 4, 3), nn.BatchNorm2d(4)),
            "MyConv is a subclass of Conv2d (may override forward)",
        ),
        (
            lambda: eval_model(nn.Conv2d(3, 4, 3), MyBN(4)),
            "BN subclass MyBN may override forward",
        ),
        (
            lambda: eval_model(_hooked_conv(), nn.BatchNorm2d(4)),
            "producer module: Conv2d has forward hooks",
        ),
        (
            lambda: eval_model(nn.ReLU(), nn.BatchNorm2d(3)),
            "BN input is not a conv, transposed conv or linear",
        ),
    ],
    ids=["two_users", "no_stats", "training", "conv_subclass", "bn_subclass", "hook", "relu"],
)
def test_refusals_leave_the_graph_alone(make: Callable[[], nn.Module], reason: str) -> None:
    model = make()
    x = spatial_input(3, 2)
    gm, result = fold(model, x, leaves=(MyConv, MyBN))

    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in gm.modules()) == 1
    if reason != "BN in training mode":  # a training BN would update its stats
        assert_equivalent(model, gm, x)


def test_a_conv_whose_rank_and_shape_are_asked_still_folds() -> None:
    """timm's BatchNormAct2d asserts ``x.ndim == 4`` on the conv output: a user of the conv that
    reads no values, and gets the same answer from the folded conv. Every timm EfficientNet kept
    its 49 BatchNorms unfolded before."""
    model, x = randomize_batchnorm(AssertedRank()).eval(), spatial_input(3, 2)
    gm, result = fold(model, x, shapes=False)
    assert (result.rewrites, result.skips) == (1, {})
    assert count_modules(gm, nn.BatchNorm2d) == 0
    assert_equivalent(model, gm, x)


def test_a_conv_whose_values_are_read_besides_its_shape_is_left() -> None:
    model, x = randomize_batchnorm(ShapeAndValues()).eval(), spatial_input(3, 2)
    gm, result = fold(model, x)
    assert result.rewrites == 0 and "producer output has" in next(iter(result.skips))
    assert_equivalent(model, gm, x)


def test_a_refused_batchnorm_does_not_stop_the_folds_after_it() -> None:
    model = eval_model(nn.Conv2d(3, 4, 1), MyBN(4), nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), seed=30)
    x = spatial_input(3, 2)

    gm, result = fold(model, x, leaves=(MyBN,))

    assert (result.rewrites, result.skips) == (1, {"BN subclass MyBN may override forward": 1})
    assert count_modules(gm, MyBN) == 1 and count_modules(gm, nn.BatchNorm2d) == 0
    assert_equivalent(model, gm, x)


def test_traced_through_conv_subclass_is_judged_by_its_body() -> None:
    # Not a leaf: traced into F.conv2d(...) * 2, so the BN follows a mul, not the conv.
    model = eval_model(MyConv(3, 4, 3), nn.BatchNorm2d(4), seed=20)
    x = spatial_input(3, 2)

    gm, result = fold(model, x)

    assert (result.rewrites, result.skips) == (
        0,
        {"BN input is not a conv, transposed conv or linear": 1},
    )
    assert_equivalent(model, gm, x)


# ---------------------------------------------------------------------------- end to end


class ResBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.downsample = nn.Sequential(nn.Conv2d(3, 8, 1, stride=2, bias=False), nn.BatchNorm2d(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
        return (y + self.downsample(x)).relu()


def _run_manager(model: nn.Module, x: torch.Tensor) -> tuple[fx.GraphModule, int, dict[str, int]]:
    gm = fx.symbolic_trace(copy.deepcopy(model))
    gm, records = run_fx_passes(gm, [FoldBatchNorm()], (x,))
    (record,) = records
    return gm, record.rewrites, record.skips


def test_resnet_block_end_to_end() -> None:
    model = randomize_batchnorm(ResBlock(), seed=21).eval()
    x = spatial_input(3, 2)

    gm, rewrites, skips = _run_manager(model, x)

    assert (rewrites, skips) == (3, {})
    assert not any(isinstance(m, nn.BatchNorm2d) for m in gm.modules())
    assert count_modules(gm, nn.Conv2d) == 3
    assert_equivalent(model, gm, x)


def test_resnet18_end_to_end() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(22)
    model = randomize_batchnorm(torchvision.models.resnet18(weights=None), seed=22).eval()
    x = torch.randn(1, 3, 32, 32)

    gm, rewrites, skips = _run_manager(model, x)

    assert (rewrites, skips) == (20, {})
    assert count_modules(gm, nn.BatchNorm2d) == 0
    assert not any(isinstance(m, nn.BatchNorm2d) for m in gm.modules())
    assert_equivalent(model, gm, x)
