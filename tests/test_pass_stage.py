"""The FX stage's side of the pass contract (``fxmobile.passes.stage``): shapes are propagated
for the passes that read them, only when stale, on copies of the example inputs; a pass that
rewrote something leaves them stale unless it keeps shapes and added no node; the stage measures
the nodes that do work and each storage's bytes once.

The passes here are minimal ``FxPass`` subclasses: which pass in the pipeline follows which
decides when fxmobile's own passes make shapes stale, and a test through them would pin that
order rather than the stage's rule. How often shapes were propagated is how often the model ran
(``RunCounter``, a leaf module, counts its calls)."""

from __future__ import annotations

import operator
from typing import ClassVar

import pytest
import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from fxmobile.infra import Pass, PassManager, PassResult
from fxmobile.passes.stage import FxContext, FxPass, FxStage, count_nodes, tensor_nbytes
from tests.helpers import LeafTracer, trace_keeping


class RunCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        return x


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.counter = RunCounter()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(self.counter(x))
        return torch.relu(y) + torch.dropout(y, 0.5, False)


def _graph_module() -> fx.GraphModule:
    root = Model().eval()
    return trace_keeping(root, RunCounter)


def _runs(gm: fx.GraphModule) -> int:
    counter = gm.get_submodule("counter")
    assert isinstance(counter, RunCounter)
    return counter.runs


class ReadsShapes(FxPass):
    """Reads shapes; records whether every call node had them."""

    summary = "reads shapes"
    needs_shapes: ClassVar[bool] = True

    def __init__(self) -> None:
        self.saw: list[bool] = []

    def call(self, unit: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        calls = [n for n in unit.graph.nodes if n.op.startswith("call_")]  # all make tensors
        self.saw.append(all("tensor_meta" in n.meta for n in calls))
        return PassResult(unit, 0)


class DoesNothing(FxPass):
    summary = "nothing"

    def call(self, unit: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return PassResult(unit, 0)


class Retargets(FxPass):
    """relu -> sigmoid in place: no new node, but not a rewrite that keeps shapes by rule."""

    summary = "relu -> sigmoid"

    def call(self, unit: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        count = 0
        for node in unit.graph.nodes:
            if node.target is torch.relu:
                node.target = torch.sigmoid
                count += 1
        return PassResult(unit, count)


class PlainRetargets(Pass[fx.GraphModule, FxContext]):
    """``Retargets`` as a plain ``Pass``: without ``needs_shapes`` or ``keeps_shapes`` it reads
    no shapes and keeps none."""

    summary = "relu -> sigmoid"

    def call(self, unit: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return Retargets().call(unit, ctx)


class RemovesDropout(FxPass):
    """dropout(y, train=False) -> y: keeps shapes, adds no node."""

    summary = "dropout -> x"
    keeps_shapes: ClassVar[bool] = True

    def call(self, unit: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        count = 0
        for node in list(unit.graph.nodes):
            if node.target is torch.dropout:
                node.replace_all_uses_with(node.args[0])
                unit.graph.erase_node(node)
                count += 1
        return PassResult(unit, count)


class AddsAnIdentity(FxPass):
    """Says it keeps shapes, and adds a node (``y + 0`` after the relu): that node has none."""

    summary = "relu(y) -> relu(y) + 0"
    keeps_shapes: ClassVar[bool] = True

    def call(self, unit: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        relu = next(n for n in unit.graph.nodes if n.target is torch.relu)
        with unit.graph.inserting_after(relu):
            plus = unit.graph.call_function(operator.add, (relu, 0))
        relu.replace_all_uses_with(plus, delete_user_cb=lambda user: user is not plus)
        return PassResult(unit, 1)


X = torch.randn(2, 4)


@pytest.mark.parametrize(
    ("passes", "runs"),
    [
        pytest.param([DoesNothing, DoesNothing], 0, id="no pass reads shapes"),
        pytest.param([ReadsShapes, ReadsShapes], 1, id="fresh shapes are not propagated again"),
        pytest.param([ReadsShapes, DoesNothing, ReadsShapes], 1, id="no rewrite keeps them"),
        pytest.param([ReadsShapes, Retargets, ReadsShapes], 2, id="a rewrite makes them stale"),
        pytest.param([ReadsShapes, Retargets, DoesNothing], 1, id="stale, and nobody reads them"),
        pytest.param([ReadsShapes, RemovesDropout, ReadsShapes], 1, id="a removal keeps them"),
        pytest.param([ReadsShapes, AddsAnIdentity, ReadsShapes], 2, id="a new node has none"),
        pytest.param([RemovesDropout, ReadsShapes], 1, id="a removal before any shapes"),
        pytest.param([PlainRetargets], 0, id="a plain pass reads no shapes"),
        pytest.param([ReadsShapes, PlainRetargets, ReadsShapes], 2, id="nor keeps them"),
    ],
)
def test_shapes_are_propagated_when_a_pass_reads_them_and_they_are_stale(
    passes: list[type[Pass[fx.GraphModule, FxContext]]], runs: int
) -> None:
    gm = _graph_module()
    instances = [p() for p in passes]
    PassManager(instances, FxStage((X,)), FxContext((X,))).run(gm)
    assert _runs(gm) == runs
    for p in instances:
        if isinstance(p, ReadsShapes):
            assert p.saw == [True]


def test_without_example_inputs_no_node_keeps_shapes_the_stage_did_not_compute() -> None:
    """Metadata a caller's ShapeProp left on the graph is dropped, not trusted."""
    gm = _graph_module()
    ShapeProp(gm).propagate(X)
    reads = ReadsShapes()
    PassManager([reads], FxStage(None), FxContext(None)).run(gm)
    assert reads.saw == [False]
    assert not any("tensor_meta" in n.meta for n in gm.graph.nodes)


class WritesItsInput(nn.Module):
    def forward(self, x: torch.Tensor, times: int) -> torch.Tensor:  # times: not a tensor
        x.mul_(times)
        return x + 1


def test_shapes_are_propagated_on_copies_of_the_example_inputs() -> None:
    gm = fx.symbolic_trace(WritesItsInput())
    x = torch.ones(3)
    reads = ReadsShapes()
    PassManager([reads], FxStage((x, 3)), FxContext((x, 3))).run(gm)
    assert reads.saw == [True]
    assert torch.equal(x, torch.ones(3)), "shape propagation wrote the example input"


class SharesStorage(nn.Module):
    """A buffer viewing the weight's storage, then a buffer of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)  # 16 + 4 floats
        self.register_buffer("row", self.fc.weight.detach()[0])  # the weight's storage
        self.register_buffer("scale", torch.ones(4))  # 4 floats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.row + self.scale


def test_the_stage_measures_nodes_that_do_work_and_each_storage_once() -> None:
    gm = fx.symbolic_trace(SharesStorage())
    # x, then fc, row, mul, scale, add, then the output
    assert count_nodes(gm) == 5
    assert tensor_nbytes(gm) == (16 + 4 + 4) * 4
    assert FxStage(None).measure(gm) == (5, (16 + 4 + 4) * 4)


def test_meta_tensors_are_measured_one_by_one() -> None:
    """Meta tensors have no storage to tell apart (every address is 0): each one counts."""
    assert tensor_nbytes(nn.Linear(4, 4, device="meta")) == (16 + 4) * 4


class CountsRecompiles(fx.GraphModule):
    """A graph module that counts its recompiles."""

    recompiles = 0

    def recompile(self) -> torch.fx.graph_module.PythonCode:
        self.recompiles += 1
        return super().recompile()


class RetargetsAGetattr(FxPass):
    """Points the linear's call at another module: same nodes, same count, new code."""

    summary = "fc -> fc2"

    def call(self, unit: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        unit.add_submodule("fc2", nn.Linear(4, 4))
        node = next(n for n in unit.graph.nodes if n.target == "fc")
        node.target = "fc2"
        return PassResult(unit, 0)  # says nothing changed: the stage must not believe it


class SameArgumentsAnew(FxPass):
    """Sets every node's arguments to equal new tuples: the code stays the same."""

    summary = "args -> equal args"

    def call(self, unit: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        for node in unit.graph.nodes:
            node.args = tuple(node.args)
        return PassResult(unit, 0)


@pytest.mark.parametrize(
    ("passes", "recompiles"),
    [
        pytest.param([DoesNothing, SameArgumentsAnew, ReadsShapes], 0, id="unchanged graphs"),
        pytest.param([Retargets], 1, id="a changed target"),
        pytest.param([RemovesDropout, DoesNothing], 1, id="a removed node"),
        pytest.param([AddsAnIdentity], 1, id="a new node"),
        pytest.param([RetargetsAGetattr, DoesNothing], 1, id="a rewrite counted as none"),
    ],
)
def test_the_graph_is_recompiled_after_each_pass_that_changed_it(
    passes: list[type[Pass[fx.GraphModule, FxContext]]], recompiles: int
) -> None:
    root = Model().eval()
    gm = CountsRecompiles(root, LeafTracer(RunCounter).trace(root))
    gm.recompiles = 0
    expected = gm.graph.python_code("self").src
    PassManager([p() for p in passes], FxStage((X,)), FxContext((X,))).run(gm)
    assert gm.recompiles == recompiles
    assert gm.code == gm.graph.python_code("self").src  # the code is the graph's, always
    assert (gm.code == expected) == (recompiles == 0)
    torch.testing.assert_close(gm(X), fx.Interpreter(gm).run(X))
