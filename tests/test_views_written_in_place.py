"""A write through any view reaches the tensor it views (``fxmobile.ops``).

``y = x + 0`` is a copy; removing it would make ``view(y).add_(1)`` write the caller's ``x``.
Every aten view op must count as a view, and a write through it must keep the copy.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import fx, nn

import fxmobile
from fxmobile import ops
from fxmobile.script import aliasing
from tests.helpers import assert_equivalent

X = torch.randn(2, 4, 6, 6)

VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "chunk": lambda y: y.chunk(2, 1)[0],
    "torch.chunk": lambda y: torch.chunk(y, 2, 1)[1],
    "split": lambda y: y.split(2, 1)[0],
    "split_sizes": lambda y: y.split([1, 3], 1)[1],
    "tensor_split": lambda y: y.tensor_split(2, 1)[0],
    "unbind": lambda y: y.unbind(1)[2],
    "narrow": lambda y: y.narrow(1, 1, 2),
    "select": lambda y: y.select(1, 0),
    "getitem_int": lambda y: y[0],
    "getitem_slice": lambda y: y[:, 1:3],
    "getitem_ellipsis": lambda y: y[..., 0],
    "unflatten": lambda y: y.unflatten(1, (2, 2)),
    "expand": lambda y: y[:, :1].expand(2, 4, 6, 6)[:, :1],
    "as_strided": lambda y: y.as_strided((2, 2), (144, 1)),
    "t": lambda y: y[0, 0].t(),
    "T": lambda y: y[0, 0].T,
    "mT": lambda y: y.mT,
    "permute": lambda y: y.permute(0, 2, 3, 1),
    "transpose": lambda y: y.transpose(1, 2),
    "swapaxes": lambda y: y.swapaxes(1, 3),
    "movedim": lambda y: y.movedim(1, 3),
    "diagonal": lambda y: y.diagonal(dim1=2, dim2=3),
    "view": lambda y: y.view(2, -1),
    "view_as": lambda y: y.view_as(y),
    "reshape": lambda y: y.reshape(8, 36),
    "flatten": lambda y: y.flatten(1),
    "unsqueeze": lambda y: y.unsqueeze(0),
    "squeeze": lambda y: y[:, :1].squeeze(1),
    "detach": lambda y: y.detach(),
    "contiguous": lambda y: y.contiguous(),
    "unfold": lambda y: y.unfold(3, 2, 2),
    "type_as": lambda y: y.type_as(y),
    "expand_as": lambda y: y.expand_as(y),
}


class CopyWrittenThroughView(nn.Module):
    def __init__(self, view: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.view = view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 0
        self.view(y).add_(1)
        return x * 2 + y


@pytest.mark.parametrize("view", VIEWS)
def test_write_through_view_of_a_copy_stays_on_the_copy(view: str) -> None:
    model = CopyWrittenThroughView(VIEWS[view]).eval()
    for route in (
        lambda: fxmobile.optimize_fx(model, X).graph_module,
        lambda: fxmobile.optimize(model, example_inputs=X).module,
    ):
        optimized = route()
        assert_equivalent(model, optimized, X.clone())
        x = X.clone()
        optimized(x)
        assert torch.equal(x, X), "the caller's input was written"


@pytest.mark.parametrize("view", VIEWS)
def test_every_view_op_is_a_view_in_the_op_table(view: str) -> None:
    gm = fx.symbolic_trace(CopyWrittenThroughView(VIEWS[view]))
    writer = next(n for n in gm.graph.nodes if n.target == "add_")
    node = writer.args[0]
    chain = []
    while node.op != "placeholder" and node.target is not torch.ops.aten.add:
        chain.append(ops.call_op(node))
        node = node.args[0]
        if node.op == "call_function" and node.target.__name__ == "add":
            break
    assert chain and all(info.view for info in chain), chain


@pytest.mark.parametrize(
    "name,view,writes",
    [
        ("relu", False, False),
        ("relu_", False, True),
        ("clone", False, False),
        ("add_", False, True),
        ("index_put_", False, True),
        ("copy_", False, True),
        ("chunk", True, False),
        ("split_with_sizes", True, False),
        ("alias", True, False),
    ],
)
def test_op_facts_come_from_the_schemas(name: str, view: bool, writes: bool) -> None:
    info = ops.aten(name)
    assert (info.view, info.writes) == (view, writes)


def test_random_ops_are_read_from_the_tags() -> None:
    assert ops.aten("bernoulli").random and ops.aten("dropout").random
    assert not ops.aten("relu").random


class ChunkWritten(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 0
        y.chunk(2, 1)[0].add_(1)
        return x * 2 + y


def test_script_ops_read_their_own_schema() -> None:
    graph = torch.jit.script(ChunkWritten().eval()).inlined_graph
    kinds = {n.kind(): ops.script_op(n) for n in graph.nodes()}
    assert kinds["aten::chunk"].view and kinds["aten::add_"].writes
    assert not kinds["aten::mul"].view and not kinds["aten::mul"].writes


def test_a_prepacked_run_reads_its_registered_schema_not_unknown() -> None:
    """script/effects.py once read registered schemas while ops.script_op called every
    non-aten op UNKNOWN, so aliasing took a prepacked conv's output for a view of its input
    (fuse_add_relu then left mobilenet_v3_small's method alone). One table now."""
    import fxmobile

    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Hardswish(inplace=True)).eval()
    module = fxmobile.optimize(model, example_inputs=torch.randn(1, 3, 4, 4)).module
    [run] = [n for n in module.graph.nodes() if n.kind() == "prepacked::conv2d_clamp_run"]
    info = ops.script_op(run)
    assert info is not ops.UNKNOWN and not info.view and not info.writes
    graph = module.graph
    assert aliasing.root(run.output()) is run.output()
    assert not [n for n in aliasing.writers(graph) if n.kind().startswith("prepacked::")]
