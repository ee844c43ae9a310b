"""Reading TorchScript modules: nodes in every block, op histograms, unfused ops, node counts and
tensor bytes, checked against walks and sums written out here."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from fxmobile.backends.library import OpFamily, ensure_registered
from fxmobile.backends.xnnpack.pipeline import SPEC
from fxmobile.script.graph_utils import (
    count_kinds,
    existing_methods,
    iter_nodes,
    method_graphs,
    node_count,
    op_histogram,
    tensor_bytes,
    unfused_ops,
)
from fxmobile.script.stage import ScriptContext, ScriptStage
from tests.script.common import CTX, frozen, scripted


def test_op_histogram_counts_inlined_kinds_and_no_bookkeeping() -> None:
    module = scripted(nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU(), nn.Conv2d(3, 3, 1)))
    hist = op_histogram(module, ["forward"])
    assert hist["aten::conv2d"] == 2 and hist["aten::relu"] == 1
    assert not {"prim::Constant", "prim::GetAttr", "prim::ListConstruct"} & set(hist)
    assert count_kinds(module, ["forward"], {"aten::conv2d", "aten::relu"}) == 3


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
    """``iter_nodes`` only asks the kinds that own blocks for them: it must still see every
    node a full walk sees."""

    def every_node(block: torch._C.Block) -> Iterator[str]:
        for node in block.nodes():
            yield node.kind()
            for inner in node.blocks():
                yield from every_node(inner)

    graph = torch.jit.script(ControlFlow()).graph
    expected = sorted(every_node(graph.block()))
    assert {"prim::If", "prim::Loop", "prim::Enter", "aten::relu", "aten::sigmoid"} <= set(expected)
    assert sorted(n.kind() for n in iter_nodes(graph)) == expected


class Work(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.conv(x))
        return y + 1, y.flatten()

    @torch.jit.export
    def other(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_node_count_counts_the_nodes_that_do_work_in_each_method() -> None:
    module = frozen(Work(), ("other",))
    assert node_count(module, ["forward"]) == 4  # conv2d, relu, add, flatten
    assert node_count(module, ["forward", "other"]) == 5
    assert existing_methods(module, ["forward", "other", "missing"]) == ["forward", "other"]
    assert len(list(method_graphs(module, ["forward", "other"]))) == 2


def test_unfused_ops_are_the_tensor_ops_without_a_packed_context() -> None:
    ensure_registered(OpFamily.XNNPACK)
    module = frozen(Work())
    assert unfused_ops(module, ["forward"]) == {
        "aten::conv2d": 1, "aten::relu": 1, "aten::add": 1, "aten::flatten": 1
    }  # fmt: skip
    for p in SPEC.passes()[2:]:  # after folding and freezing: the rest of the CPU pipeline
        module = p.call(module, CTX).unit
    assert unfused_ops(module, ["forward"]) == {"aten::add": 1, "aten::flatten": 1}


class AddsTwice(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 1) + 2


def test_unfused_ops_count_each_node_of_a_kind() -> None:
    assert unfused_ops(frozen(AddsTwice()), ["forward"]) == {"aten::add": 2}


def test_tensor_bytes_count_each_storage_once_and_packed_contexts_too() -> None:
    ensure_registered(OpFamily.XNNPACK)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 1)).eval()
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert tensor_bytes(scripted(model), ["forward"]) == weights  # attributes
    module = frozen(model)
    assert tensor_bytes(module, ["forward"]) == weights  # graph constants
    for p in SPEC.passes()[2:]:
        module = p.call(module, CTX).unit
        if type(p).__name__ == "FoldPrepacking":  # contexts are graph constants until hoisted
            kinds = {n.kindOf("value") for n in module.graph.nodes() if n.hasAttribute("value")}
            assert "ival" in kinds
            assert tensor_bytes(module, ["forward"]) == weights
    # the weights now live in packed contexts (their pickled state holds them)
    assert tensor_bytes(module, ["forward"]) == weights


def test_tensor_bytes_count_a_tied_weight_once() -> None:
    model = nn.Sequential(nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)).eval()
    model[1].weight = model[0].weight
    unique = sum(p.numel() * 4 for p in model.parameters())  # parameters() lists it once
    assert tensor_bytes(scripted(model), ["forward"]) == unique
    assert tensor_bytes(frozen(model), ["forward"]) == unique


def test_the_stage_lints_every_rewritten_method_and_measures_the_module() -> None:
    module = frozen(Work(), ("other",))
    stage = ScriptStage(ScriptContext(("forward", "other"), ("other",)))
    nodes, size = stage.measure(module)
    assert nodes == 5 and size == sum(p.numel() * 4 for p in Work().parameters())


class SavesItsStateScaled(nn.Module):
    """A submodule with TorchScript ``__getstate__``/``__setstate__`` of its own (custom
    serialization): a module, not a packed context, whatever its state computes."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, bool]:
        return (self.w * 1000, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, bool]) -> None:
        self.w = state[0] / 1000
        self.training = state[1]


def test_a_submodule_that_defines_getstate_is_counted_as_a_module() -> None:
    """Only packed contexts (``__torch__.torch.classes.*``) are read through ``__getstate__``:
    a module's state is its attributes, counted once each."""
    module = torch.jit.script(nn.Sequential(SavesItsStateScaled()).eval())
    assert tensor_bytes(module, ["forward"]) == 4 * 4


def test_tensor_bytes_reads_a_packed_context_frozen_into_a_constant() -> None:
    """Freezing a quantized layer makes its packed parameters a graph constant (an ``ival``):
    their int8 weight and float bias are in its pickled state."""
    linear = torch.ao.nn.quantized.Linear(8, 4)
    module = frozen(nn.Sequential(linear).eval())
    kinds = [n.kindOf("value") for n in module.graph.nodes() if n.hasAttribute("value")]
    assert "ival" in kinds
    weight, bias = linear._weight_bias()
    assert tensor_bytes(module, ["forward"]) == weight.numel() * 1 + bias.numel() * 4
