"""Softmax over a dim that is not the last, as a softmax over the last between two permutes.

    y = softmax(x, d)      ->  y = permute(softmax(permute(x, P), -1), P)
                               P swaps d and the last dim (its own inverse)

Softmax normalizes each line of elements along ``d``, independently of the others; the permute
makes those lines the last dim's, in the same order, and the second permute puts every result
back where it came from. The same exponentials over the same elements: eager's value to
rounding (ATen's kernels for the last dim and for an inner one may sum in different orders),
NaN and infinities included (a NaN or a +inf spoils its own line only, as in eager).
ExecuTorch's XNNPACK partitioner takes ``_softmax`` only over the last dim ("dim must be the
last dim"), so YOLO's distribution-focal-loss head (``x.view(b, 4, c, a).transpose(2,
1).softmax(1)``) runs on a portable kernel between two delegate calls; XNNPACK takes the
permutes.

Matched: ``aten.softmax.int`` (with its ``dtype``, kept) and ``aten._softmax``. Left alone, with
the reason: an input whose rank is unknown.
"""

from __future__ import annotations

from typing import ClassVar

from torch import fx

from fxmobile.executorch.passes.aten import aten, call, positive_dim, replace_with, shape
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

SOFTMAXES = frozenset({aten.softmax.int, aten._softmax.default})


def can_move(node: fx.Node) -> list[int] | str | None:
    """The permutation that makes ``node``'s softmax dim the last, a reason to stay, or None
    when ``node`` is no softmax over another dim."""
    if node.op != "call_function" or node.target not in SOFTMAXES:
        return None
    sizes = shape(node.args[0])
    if sizes is None:
        return "input rank unknown (pass example_inputs)"
    rank = len(sizes)
    dim = positive_dim(node.args[1], rank) if rank else 0
    if dim >= rank - 1:
        return None
    order = list(range(rank))
    order[dim], order[-1] = order[-1], order[dim]
    return order


def move(gm: fx.GraphModule, node: fx.Node, order: list[int]) -> fx.Node:
    """The permutes around a softmax over the last dim, inserted before ``node``; its output."""
    graph = gm.graph
    with graph.inserting_before(node):
        x = call(graph, aten.permute.default, node.args[0], order)
        y = call(graph, node.target, x, -1, *node.args[2:], **node.kwargs)
        return call(graph, aten.permute.default, y, order)


class SoftmaxOverLastDim(FxPass):
    """Move each softmax over another dim to the last, with a permute before and after."""

    optimization = MobileOptimizerType.SOFTMAX_OVER_LAST_DIM
    summary: ClassVar[str] = "softmax(x, d) -> permute(softmax(permute(x, d<->-1), -1), d<->-1)"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            order = can_move(node)
            if isinstance(order, str):
                skips.add(order)
            elif order is not None:
                replace_with(node, move(gm, node, order))
                rewrites += 1
        return PassResult(gm, rewrites, dict(skips))
