"""Inlining standard leaf-module calls before scripting (``fxmobile.passes.inline_modules``)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq
import torch.nn.functional as F
import torchvision
from torch import fx, nn

from fxmobile.passes.inline_modules import INLINERS, InlineModules, inline_leaf_modules
from fxmobile.passes.stage import FxContext
from fxmobile.script.quiet_script import quietly_script
from tests.helpers import count_calls, trace_keeping


def _freeze(module: nn.Module) -> torch.jit.ScriptModule:
    return torch.jit.freeze(quietly_script(module).eval())


# every type INLINERS knows, in a configuration its forward takes without a skip
EVERY_KIND = {
    nn.Conv1d: (nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=1, groups=1), (2, 3, 9)),
    nn.Conv2d: (nn.Conv2d(4, 6, 3, padding="same", dilation=2, groups=2), (2, 4, 7, 7)),
    nn.Conv3d: (nn.Conv3d(2, 4, 2, bias=False), (1, 2, 4, 4, 4)),
    nn.ConvTranspose1d: (nn.ConvTranspose1d(3, 2, 3, stride=2, output_padding=1), (2, 3, 5)),
    nn.ConvTranspose2d: (
        nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, groups=2, dilation=2),
        (1, 4, 5, 5),
    ),
    nn.ConvTranspose3d: (nn.ConvTranspose3d(2, 2, 2, bias=False), (1, 2, 3, 3, 3)),
    nn.MaxPool1d: (nn.MaxPool1d(3, 2, padding=1, ceil_mode=True), (2, 3, 10)),
    nn.MaxPool2d: (nn.MaxPool2d(3, 2, padding=1, dilation=2), (2, 3, 9, 9)),
    nn.MaxPool3d: (nn.MaxPool3d(2), (1, 2, 4, 4, 4)),
    nn.Linear: (nn.Linear(5, 3), (2, 5)),
    nn.ReLU: (nn.ReLU(), (2, 5)),
    nn.ReLU6: (nn.ReLU6(), (2, 5)),
    nn.Hardtanh: (nn.Hardtanh(-0.3, 0.2), (2, 5)),
    nn.Hardswish: (nn.Hardswish(), (2, 5)),
    nn.Hardsigmoid: (nn.Hardsigmoid(), (2, 5)),
    nn.SiLU: (nn.SiLU(), (2, 5)),
    nn.Sigmoid: (nn.Sigmoid(), (2, 5)),
    nn.Tanh: (nn.Tanh(), (2, 5)),
    nn.GELU: (nn.GELU(approximate="tanh"), (2, 5)),
    nn.AdaptiveAvgPool1d: (nn.AdaptiveAvgPool1d(3), (2, 3, 7)),
    nn.AdaptiveAvgPool2d: (nn.AdaptiveAvgPool2d((2, 3)), (2, 3, 7, 8)),
    nn.AdaptiveAvgPool3d: (nn.AdaptiveAvgPool3d(2), (1, 2, 5, 4, 4)),
    nn.AvgPool2d: (nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), (2, 3, 8, 8)),
    nn.Flatten: (nn.Flatten(1, 2), (2, 3, 4, 5)),
    nnq.Conv1d: (nnq.Conv1d(3, 4, 3, padding=1), (2, 3, 9)),
    nnq.Conv2d: (nnq.Conv2d(4, 6, 3, stride=2, groups=2), (1, 4, 9, 9)),
    nnq.Conv3d: (nnq.Conv3d(2, 4, 2), (1, 2, 4, 4, 4)),
    nniq.ConvReLU1d: (nniq.ConvReLU1d(3, 4, 3), (2, 3, 9)),
    nniq.ConvReLU2d: (nniq.ConvReLU2d(3, 4, 3, padding=1), (1, 3, 8, 8)),
    nniq.ConvReLU3d: (nniq.ConvReLU3d(2, 4, 2), (1, 2, 4, 4, 4)),
}
QUANTIZED = (nnq.Conv1d, nnq.Conv2d, nnq.Conv3d, nniq.ConvReLU1d, nniq.ConvReLU2d, nniq.ConvReLU3d)


def _input(kind: type[nn.Module], shape: tuple[int, ...]) -> torch.Tensor:
    x = torch.randn(shape)
    return torch.quantize_per_tensor(x, 0.05, 64, torch.quint8) if kind in QUANTIZED else x


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_quantized:
        return a.q_scale() == b.q_scale() and torch.equal(a.int_repr(), b.int_repr())
    return torch.equal(a, b)


def test_every_inlined_kind_is_covered_here() -> None:
    assert set(EVERY_KIND) == set(INLINERS)


@pytest.mark.parametrize("kind", list(EVERY_KIND), ids=lambda k: k.__name__)
def test_inlined_call_computes_what_the_module_did_bit_for_bit(kind: type[nn.Module]) -> None:
    module, shape = EVERY_KIND[kind]
    gm = fx.symbolic_trace(nn.Sequential(copy.deepcopy(module)).eval())
    inlined, count, _ = inline_leaf_modules(gm)
    assert count == 1
    assert not [n for n in inlined.graph.nodes if n.op == "call_module"]
    assert not list(inlined.children()), "the inlined module is still held"
    x = _input(kind, shape)
    with torch.no_grad():
        expected = gm(x)
        assert _same(inlined(x), expected)
        assert _same(_freeze(inlined)(x), expected)


@pytest.mark.parametrize(
    ("module", "shape"),
    [
        (nn.AdaptiveAvgPool2d(1), (1, 8, 7, 7)),
        (nn.AdaptiveAvgPool2d((2, 3)), (2, 3, 7, 8)),
        (nn.AdaptiveAvgPool3d((1, 2, 2)), (1, 2, 5, 4, 4)),
    ],
    ids=["int", "pair", "3d"],
)
def test_an_adaptive_pool_leaves_no_shape_arithmetic(
    module: nn.Module, shape: tuple[int, ...]
) -> None:
    """F.adaptive_avg_pool2d fills a None size from the input's before its ATen op, and
    TorchScript kept that (aten::size, len, gt, prim::If) in the frozen graph, run on every
    call: mobilenet_v3_small had 10 such blocks, efficientnet_b0 17. With every size given the
    call is the ATen op itself."""
    gm = fx.symbolic_trace(nn.Sequential(copy.deepcopy(module)).eval())
    inlined, count, _ = inline_leaf_modules(gm)
    assert count == 1
    frozen = _freeze(inlined)
    kinds = {n.kind() for n in frozen.graph.nodes()}
    assert not kinds & {"prim::If", "aten::len", "aten::size"}, kinds
    x = torch.randn(shape)
    with torch.no_grad():
        assert torch.equal(frozen(x), gm(x))


class FunctionalPools(nn.Module):
    """The functional forms as torchvision writes them (mobilenet_v2: ``(1, 1)``), with the
    size in a keyword, from the input, and computed in forward."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            F.adaptive_avg_pool2d(x, (1, 1)),
            F.adaptive_avg_pool2d(x, output_size=2),
            F.adaptive_avg_pool2d(x, (None, 3)),
            F.adaptive_avg_pool2d(x, x.shape[-1] // 2),
        )


def test_functional_adaptive_pools_with_constant_sizes_become_the_aten_op() -> None:
    model = FunctionalPools().eval()
    gm = fx.symbolic_trace(model)
    inlined, count, _ = inline_leaf_modules(gm)
    assert count == 2
    assert count_calls(inlined, torch._C._nn.adaptive_avg_pool2d) == 2
    assert count_calls(inlined, F.adaptive_avg_pool2d) == 2  # None, and a size from forward
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        for got, expected in zip(inlined(x), model(x), strict=True):
            assert torch.equal(got, expected)


def test_an_adaptive_pool_with_a_size_from_the_input_stays_a_call() -> None:
    """``(None, 3)`` has no TorchScript literal (the module itself does not script either)."""
    gm = fx.symbolic_trace(nn.Sequential(nn.AdaptiveAvgPool2d((None, 3))).eval())
    _, count, skips = inline_leaf_modules(gm)
    assert count == 0 and dict(skips) == {
        "AdaptiveAvgPool2d configuration has no functional form": 1
    }


def test_a_quantized_conv_leaves_no_rank_check_in_the_frozen_graph() -> None:
    """A quantized convolution's forward checks the input's rank in Python before its
    quantized:: op, and TorchScript kept that in the frozen graph before every convolution
    (quantized mobilenet_v3_large: 62 size / len / ne / prim::If blocks). Written out, the
    frozen graph is the quantized ops on their packed weights; a padding mode other than zeros
    (forward pads first) stays a call."""
    model = nn.Sequential(
        nniq.ConvReLU2d(3, 4, 3, padding=1),
        nnq.Conv2d(4, 4, 1),
        nnq.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"),
    ).eval()
    gm = fx.symbolic_trace(model)
    inlined, count, skips = inline_leaf_modules(gm)
    assert count == 2 and dict(skips) == {"Conv2d configuration has no functional form": 1}
    with_calls = {n.kind() for n in _freeze(gm).graph.nodes()}
    assert {"prim::If", "aten::len"} <= with_calls
    frozen = _freeze(inlined)
    kinds = [n.kind() for n in frozen.graph.nodes() if n.kind() != "prim::Constant"]
    assert kinds.count("quantized::conv2d_relu") == 1 and kinds.count("quantized::conv2d") == 2
    assert kinds.count("prim::If") == 1  # the reflect-padded conv's own check
    x = _input(nnq.Conv2d, (1, 3, 8, 8))
    with torch.no_grad():
        assert _same(frozen(x), gm(x))


def test_in_place_activation_stays_in_place() -> None:
    gm = fx.symbolic_trace(nn.Sequential(nn.ReLU(inplace=True)))
    inlined, _, _ = inline_leaf_modules(gm)
    x = torch.randn(4) - 0.5
    out = inlined(x)
    assert out is x and bool((x >= 0).all())


class Mixed(nn.Module):
    """What must stay a module call, next to calls that are inlined."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.reflect = nn.Conv2d(3, 3, 3, padding=1, padding_mode="reflect")
        self.bn = nn.BatchNorm2d(3)
        self.up = nn.ConvTranspose2d(3, 3, 3, stride=2)
        self.pool = nn.MaxPool2d(2, return_indices=True)
        self.custom = Conv2dSubclass(3, 3, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.bn(self.reflect(self.conv(x)))
        z = self.up(y, output_size=[14, 14])
        pooled, indices = self.pool(y)
        return self.custom(self.conv(y)), z, pooled, indices


class Conv2dSubclass(nn.Conv2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def test_what_a_function_cannot_say_stays_a_module_call() -> None:
    model = Mixed().eval()
    gm = trace_keeping(model, Conv2dSubclass)
    text = gm.code
    inlined, count, skips = inline_leaf_modules(gm)
    assert count == 2, "only the two calls to self.conv"
    assert dict(skips) == {  # bn, custom: no inliner for their type, nothing to say
        "Conv2d configuration has no functional form": 1,  # reflect padding
        "ConvTranspose2d called with more than one input": 1,  # output_size=
        "MaxPool2d configuration has no functional form": 1,  # return_indices
    }
    kept = {str(n.target) for n in inlined.graph.nodes if n.op == "call_module"}
    assert kept == {"reflect", "bn", "up", "pool", "custom"}
    assert count_calls(inlined, F.conv2d) == 2
    gets = [n for n in inlined.graph.nodes if n.op == "get_attr"]
    assert len(gets) == 4 and len({n.target for n in gets}) == 2, "shared tensors hoisted once"
    assert gm.code == text and hasattr(gm, "conv"), "the input graph module was changed"
    x = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        for got, expected in zip(inlined(x), model(x), strict=True):
            assert torch.equal(got, expected)


def test_calls_with_hooks_or_an_own_forward_stay_module_calls() -> None:
    hooked, patched, plain = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3)
    hooked.register_forward_hook(lambda module, args, out: out * 2)
    patched.forward = lambda input: input  # type: ignore[method-assign]
    model = nn.Sequential(hooked, patched, plain).eval()
    gm = fx.symbolic_trace(model)
    result = InlineModules().call(gm, FxContext())
    inlined = result.unit
    assert result.rewrites == 1
    assert result.skips == {
        "Linear has forward hooks": 1,
        "Linear instance has a forward of its own": 1,
    }
    assert {str(n.target) for n in inlined.graph.nodes if n.op == "call_module"} == {"0", "1"}
    x = torch.randn(2, 3)
    with torch.no_grad():
        assert torch.equal(inlined(x), model(x))


def test_nothing_to_inline_returns_the_module_itself() -> None:
    gm = fx.symbolic_trace(nn.Sequential(nn.BatchNorm2d(3)))
    assert inline_leaf_modules(gm)[:2] == (gm, 0)


def test_hoisted_names_do_not_shadow_root_attributes() -> None:
    class Clash(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.lin_weight = nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + self.lin_weight

    model = Clash().eval()
    inlined, _, _ = inline_leaf_modules(fx.symbolic_trace(model))
    x = torch.randn(3, 2)
    with torch.no_grad():
        assert torch.equal(inlined(x), model(x))


def test_resnet_freezes_to_the_same_graph_as_with_module_calls_less_shape_arithmetic() -> None:
    model = torchvision.models.resnet18().eval()
    gm = fx.symbolic_trace(model)
    inlined, count, _ = inline_leaf_modules(gm)
    assert count == 20 + 17 + 1 + 1 + 1, "convs, relus, maxpool, avgpool, fc"
    with_modules, without = _freeze(gm), _freeze(inlined)
    # the same graph, less the shape arithmetic the module's F.adaptive_avg_pool2d kept
    shape_arithmetic = {"aten::size", "aten::len", "aten::gt", "prim::If"}
    kinds = [n.kind() for n in with_modules.graph.nodes()]
    assert shape_arithmetic <= set(kinds)
    assert [k for k in kinds if k not in shape_arithmetic and k != "prim::Constant"] == [
        k for k in (n.kind() for n in without.graph.nodes()) if k != "prim::Constant"
    ]
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(without(x), with_modules(x))


class TwoPathsOneName(nn.Module):
    """``a.b`` and ``a_b``: both weights would be hoisted as ``a_b_weight``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Module()
        self.a.add_module("b", nn.Linear(2, 2))
        self.a_b = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a_b(self.a.get_submodule("b")(x))


def test_two_module_paths_that_flatten_to_one_name_get_one_attribute_each() -> None:
    model = TwoPathsOneName().eval()
    gm = fx.symbolic_trace(model)
    inlined, count, skips = inline_leaf_modules(gm)
    assert (count, dict(skips)) == (2, {})
    assert type(inlined).__name__ == type(gm).__name__ == "TwoPathsOneName"  # errors name it
    assert inlined.training is False
    names = {str(n.target) for n in inlined.graph.nodes if n.op == "get_attr"}
    assert names == {"a_b_weight", "a_b_bias", "a_b_weight_1", "a_b_bias_1"}
    x = torch.randn(3, 2)
    with torch.no_grad():
        assert torch.equal(inlined(x), model(x))
