"""TorchScript-stage passes shared by every backend: counts of real op kinds, and numerics."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
import torch.utils.bundled_inputs
from torch import nn

from fxmobile.backends.xnnpack.conv1d_to_conv2d import Conv1dToConv2d
from fxmobile.backends.xnnpack.fuse_add_relu import FuseAddRelu
from fxmobile.backends.xnnpack.hoist_conv_packed_params import (
    PREFIX,
    HoistConvPackedParams,
    hoist_packed_params,
)
from fxmobile.script.canonicalize import Canonicalize
from fxmobile.script.fold_batchnorm import FoldBatchNorm
from fxmobile.script.freeze import Freeze, bundled_inputs_attributes, freeze
from fxmobile.script.fuse_linear import FuseLinear
from fxmobile.script.graph_utils import count_kinds, iter_nodes, op_histogram
from fxmobile.script.jit_passes import jit
from fxmobile.script.remove_dropout import RemoveDropout
from fxmobile.script.scripting import quietly_script, to_torchscript
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent, captured, randomize_batchnorm

CTX = ScriptContext(("forward",), ())


def scripted(model: nn.Module) -> torch.jit.ScriptModule:
    return quietly_script(model.eval())


def frozen(model: nn.Module) -> torch.jit.ScriptModule:
    """Frozen, so with types of its own: in-place rewrites cannot leak into other modules."""
    return freeze(scripted(model), [])


def test_conv1d_becomes_conv2d() -> None:
    model = nn.Sequential(nn.Conv1d(3, 6, 3, stride=2, padding=1, dilation=2), nn.ReLU()).eval()
    result = Conv1dToConv2d().call(frozen(model), CTX)
    assert result.rewrites == 1
    assert count_kinds(result.unit, ["forward"], {"aten::conv1d"}) == 0
    assert count_kinds(result.unit, ["forward"], {"aten::conv2d"}) == 1
    assert_equivalent(model, result.unit, torch.randn(2, 3, 17))


def test_scripted_conv_bn_is_folded_in_the_frozen_graph() -> None:
    model = randomize_batchnorm(nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4)))
    model.eval()
    ctx = ScriptContext(("forward",), (), (torch.randn(1, 3, 8, 8),))
    result = FoldBatchNorm().call(frozen(model), ctx)
    assert result.rewrites == 1
    assert count_kinds(result.unit, ["forward"], {"aten::batch_norm"}) == 0
    assert_equivalent(model, result.unit, torch.randn(1, 3, 8, 8))


class AddmmLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 4))
        self.b = nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.b, x, self.w.t()) + torch.matmul(x, self.w.t())


def test_addmm_and_matmul_become_linear() -> None:
    model = AddmmLinear().eval()
    module = frozen(model)
    result = FuseLinear().call(module, CTX)
    assert result.rewrites == 2
    assert count_kinds(result.unit, ["forward"], {"aten::addmm", "aten::matmul"}) == 0
    assert_equivalent(model, result.unit, torch.randn(3, 4))


class AddRelu(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.relu(a + b)
        z = a.add(b).relu_()
        return y + z


def test_add_relu_fused() -> None:
    model = AddRelu().eval()
    module = frozen(model)
    result = FuseAddRelu().call(module, CTX)
    assert result.rewrites == 2
    assert count_kinds(result.unit, ["forward"], {"aten::relu", "aten::relu_"}) == 0
    assert_equivalent(model, result.unit, torch.randn(4), torch.randn(4))


class Dropouts(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.5, False) + F.dropout(x, 0.5, True) * 0


def test_dropout_with_constant_false_removed_only() -> None:
    module = frozen(Dropouts())
    result = RemoveDropout().call(module, CTX)
    assert result.rewrites == 1
    assert count_kinds(result.unit, ["forward"], {"aten::dropout"}) == 1


def test_canonicalize_removes_common_subexpressions() -> None:
    class Sine(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sin(x) * 2

    module = frozen(Sine())
    graph = module.graph
    sin = graph.findNode("aten::sin")
    with graph.insert_point_guard(sin):
        twin = graph.insert("aten::sin", [sin.inputsAt(0)])  # what an earlier rewrite may leave
    mul = graph.findNode("aten::mul")
    mul.replaceInput(0, twin)
    result = Canonicalize().call(module, CTX)
    assert result.rewrites == 1
    assert count_kinds(result.unit, ["forward"], {"aten::sin"}) == 1


class WithExport(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)

    @torch.jit.export
    def twice(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * 2


def test_freeze_keeps_preserved_methods_and_inlines_submodules() -> None:
    module = scripted(WithExport())
    result = Freeze().call(module, ScriptContext(("forward", "twice"), ("twice",)))
    assert result.rewrites == 1  # the Linear submodule was inlined away
    assert result.unit._c._has_method("twice")
    x = torch.randn(2, 3)
    torch.testing.assert_close(result.unit.twice(x), module.twice(x))


def test_bundled_inputs_attributes_match_upstream() -> None:
    module = scripted(WithExport())
    torch.utils.bundled_inputs.augment_many_model_functions_with_bundled_inputs(
        module, {module.forward: [(torch.randn(1, 3),)], module.twice: [(torch.randn(1, 3),)]}
    )
    attrs = bundled_inputs_attributes(module, ["twice"])
    assert attrs == [
        "get_all_bundled_inputs",
        "get_num_bundled_inputs",
        "get_bundled_inputs_functions_and_info",
        "forward",
        "get_all_bundled_inputs_for_forward",
        "_bundled_inputs_deflated_forward",
        "get_all_bundled_inputs_for_twice",
        "_bundled_inputs_deflated_twice",
    ]


def _quantized_model() -> nn.Module:
    class Q(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.quant = torch.ao.quantization.QuantStub()
            self.conv = nn.Conv2d(3, 4, 3)
            self.inner = nn.Sequential(nn.Conv2d(4, 4, 1))
            self.dequant = torch.ao.quantization.DeQuantStub()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.dequant(self.inner(self.conv(self.quant(x))))

    model = Q().eval()
    model.qconfig = torch.ao.quantization.get_default_qconfig("qnnpack")
    torch.ao.quantization.prepare(model, inplace=True)
    model(torch.randn(2, 3, 8, 8))
    return torch.ao.quantization.convert(model)


@pytest.fixture
def qnnpack() -> Iterator[None]:
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "qnnpack"
    yield
    torch.backends.quantized.engine = previous


@pytest.mark.usefixtures("qnnpack")
def test_quantized_conv_packed_params_hoisted_with_upstream_names() -> None:
    model = _quantized_model()
    module = scripted(model)
    module = torch.jit.load(io.BytesIO(module.save_to_buffer()))  # fresh types: inlined below
    jit._jit_pass_inline(module.graph)  # unfrozen: the GetAttr chains are still there
    assert hoist_packed_params(module, ["forward"]) == 2
    assert module._c.hasattr(f"{PREFIX}.conv._packed_params.1")
    assert module._c.hasattr(f"{PREFIX}.inner.0._packed_params.2")
    x = torch.randn(1, 3, 8, 8)
    assert torch.equal(module(x), model(x))
    fresh = torch.jit.load(io.BytesIO(scripted(model).save_to_buffer()))
    jit._jit_pass_inline(fresh.graph)
    result = HoistConvPackedParams().call(fresh, CTX)
    assert result.rewrites == 2
    assert not list(result.unit.children())  # freezing afterwards dropped the convs
    assert torch.equal(result.unit(x), model(x))


class AnnotatedReturn(nn.Module):
    """Like googlenet: the forward's annotation names a type it does not return in eval."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return self.lin(x)  # type: ignore[return-value]


def test_scripting_drops_the_return_annotation_fx_copied() -> None:
    gm = captured(AnnotatedReturn().eval()).graph_module  # also resolves string annotations
    module, note = to_torchscript(gm, None)
    assert note is None
    x = torch.randn(2, 3)
    torch.testing.assert_close(module(x), gm(x))


def test_op_histogram_counts_inlined_kinds() -> None:
    module = scripted(nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU(), nn.Conv2d(3, 3, 1)))
    hist = op_histogram(module, ["forward"])
    assert hist["aten::conv2d"] == 2 and hist["aten::relu"] == 1
    assert "prim::Constant" not in hist


class ControlFlow(nn.Module):
    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        for _ in range(n):
            if bool(x.sum() > 0):
                x = x.relu()
            else:
                with torch.no_grad():
                    x = x.sigmoid()
        return x


def test_iter_nodes_finds_the_nodes_inside_every_block() -> None:
    """``iter_nodes`` only asks the kinds in ``_WITH_BLOCKS`` for blocks: it must still see
    every node a full walk sees."""

    def every_node(block: torch._C.Block) -> Iterator[str]:
        for node in block.nodes():
            yield node.kind()
            for inner in node.blocks():
                yield from every_node(inner)

    graph = torch.jit.script(ControlFlow()).graph
    expected = sorted(every_node(graph.block()))
    assert {"prim::If", "prim::Loop", "prim::Enter", "aten::relu", "aten::sigmoid"} <= set(expected)
    assert sorted(n.kind() for n in iter_nodes(graph)) == expected


@pytest.mark.parametrize("pass_", [Canonicalize(), FuseAddRelu()])
def test_pass_with_nothing_to_do_reports_zero(pass_: object) -> None:
    module = frozen(nn.Sequential(nn.Linear(2, 2)))
    result = pass_.call(module, CTX)  # type: ignore[attr-defined]
    assert result.rewrites == 0 and not result.modified


def test_conv1d_with_string_padding_is_left_alone() -> None:
    """Found by the fuzzer: torch's rewrite breaks the graph for padding='same'."""
    model = nn.Sequential(nn.Conv1d(2, 1, 1, padding="same"), nn.ReLU()).eval()
    result = Conv1dToConv2d().call(frozen(model), CTX)
    assert result.rewrites == 0 and result.skips == {"conv1d with string padding": 1}
    Canonicalize().call(result.unit, CTX)
    assert_equivalent(model, result.unit, torch.randn(1, 2, 3))
