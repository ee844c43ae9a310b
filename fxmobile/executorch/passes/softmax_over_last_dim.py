"""Softmax as XNNPACK computes it right: over the last dim, of a tensor it holds row-major.

    y = softmax(x, d)      ->  y = permute(softmax(permute(x, P), -1), P)
                               P swaps d and the last dim (its own inverse)
    y = softmax(x, -1)     ->  y = reshape(softmax(reshape(x, (-1, n)), -1), x.shape)
        x of rank 4, from an op the delegate runs channels-last

Softmax normalizes each line of elements along ``d``, independently of the others; the permute
makes those lines the last dim's, in the same order, and the second permute puts every result
back where it came from. The same exponentials over the same elements: eager's value to
rounding (ATen's kernels for the last dim and for an inner one may sum in different orders),
NaN and infinities included (a NaN or a +inf spoils its own line only, as in eager).
ExecuTorch's XNNPACK partitioner takes ``_softmax`` only over the last dim ("dim must be the
last dim"), so YOLO's distribution-focal-loss head (``x.view(b, 4, c, a).transpose(2,
1).softmax(1)``) runs on a portable kernel between two delegate calls; XNNPACK takes the
permutes.

The delegate runs a convolution, a pooling, a mean or an upsampling in channels-last (NHWC) and
keeps the tensors after it so through ops it holds layout-free (elementwise ops, slices,
permutes), converting back before a reshape. ExecuTorch 1.5.1 counts softmax among those, but
XNNPACK's softmax normalizes the last dim of the memory it is given: after a convolution that is
the channels, not the rows. ExecuTorch's own flow normalizes ``conv(x).softmax(-1)`` over each
pixel's channels (every value 1.0 for one channel; timm's MobileViT-v2 attention, ``q, k, v =
qkv.split(...)`` then ``q.softmax(-1)``, off by 1.5 of its output's scale once the split is
delegated). Such a softmax, of a rank-4 tensor an op of that kind may reach, here runs over the
rows of a rank-2 reshape, which the delegate reads row-major: the same lines, in the same
order.

Matched: ``aten.softmax.int`` (with its ``dtype``, kept) and ``aten._softmax``. Left alone, with
the reason: an input whose rank is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import aten, call, numel, positive_dim, replace_with, shape
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

SOFTMAXES = frozenset({aten.softmax.int, aten._softmax.default})

# what the delegate converts back to row-major before it runs it (its view_copy, squeeze_copy,
# unsqueeze_copy and linear)
ROW_MAJOR = frozenset(
    {
        aten.view.default,
        aten.reshape.default,
        aten._unsafe_view.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.squeeze.default,
        aten.unsqueeze.default,
        aten.linear.default,
    }
)
# what the delegate runs in the layout of its input, besides elementwise ops
LAYOUT_FREE = frozenset(
    {
        aten.slice.Tensor,
        aten.cat.default,
        aten.permute.default,
        aten.constant_pad_nd.default,
        aten.pad.default,
        aten.clone.default,
        aten.alias.default,
        aten.contiguous.default,
        aten._to_copy.default,
        aten.expand.default,
    }
)


@dataclass(frozen=True)
class Softmax:
    """A softmax to rewrite: its permutation to the last dim (None when over it already), and
    whether it runs over the rows of a rank-2 reshape."""

    node: fx.Node
    order: list[int] | None
    rows: bool


def channels_last(graph: fx.Graph) -> set[fx.Node]:
    """The nodes whose rank-4 tensor the delegate may hold channels-last: an op other than an
    elementwise or a layout-free one (a convolution, a pooling, an op fxmobile does not know)
    reaches them through rank-4 tensors without a reshape between. One walk in graph order,
    each node answered from its inputs'; a softmax hands on none, once this pass has run."""
    found: set[fx.Node] = set()
    for node in graph.nodes:
        sizes = shape(node)
        inputs = node.all_input_nodes
        if node.op != "call_function" or sizes is None or len(sizes) != 4 or not inputs:
            continue
        if node.target in SOFTMAXES:
            continue
        if node.target in ROW_MAJOR:
            # a reshape to its input's own shape is a no-op, which reshape_views removes
            if shape(node.args[0]) == sizes and node.args[0] in found:
                found.add(node)
        elif node.target in LAYOUT_FREE or torch.Tag.pointwise in getattr(node.target, "tags", ()):
            if any(a in found for a in inputs):
                found.add(node)
        else:
            found.add(node)
    return found


def softmax(node: fx.Node, channels_last: set[fx.Node]) -> Softmax | str | None:
    """The rewrite of ``node``'s softmax, a reason to stay, or None when ``node`` is no softmax
    or one XNNPACK computes right as it is."""
    if node.op != "call_function" or node.target not in SOFTMAXES:
        return None
    sizes = shape(node.args[0])
    if sizes is None:
        return "input rank unknown (pass example_inputs)"
    rank = len(sizes)
    dim = positive_dim(node.args[1], rank) if rank else 0
    order = None
    if dim < rank - 1:
        order = list(range(rank))
        order[dim], order[-1] = order[-1], order[dim]
    rows = rank == 4 and node.args[0] in channels_last
    return Softmax(node, order, rows) if order is not None or rows else None


def rewrite(gm: fx.GraphModule, match: Softmax) -> fx.Node:
    """The softmax over the last dim (of the rows), inserted before the matched node; its
    output."""
    node, order = match.node, match.order
    sizes = shape(node.args[0])
    assert sizes is not None
    graph = gm.graph
    with graph.inserting_before(node):
        x = node.args[0]
        if order is not None:
            x = call(graph, aten.permute.default, x, order)
            sizes = tuple(sizes[i] for i in order)
        if match.rows:
            x = call(graph, aten.reshape.default, x, [numel(sizes) // sizes[-1], sizes[-1]])
        y = call(graph, node.target, x, -1, *node.args[2:], **node.kwargs)
        if match.rows:
            y = call(graph, aten.reshape.default, y, list(sizes))
        if order is not None:
            y = call(graph, aten.permute.default, y, order)
        return y


class SoftmaxOverLastDim(FxPass):
    """Move each softmax over another dim to the last, with a permute before and after, and
    one after a channels-last op onto the rows of a reshape."""

    optimization = MobileOptimizerType.SOFTMAX_OVER_LAST_DIM
    summary: ClassVar[str] = (
        "softmax(x, d) -> permute(softmax(permute(x, d<->-1), -1), d<->-1); after a conv, "
        "over reshape(x, (-1, n))"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        skips = Skips()
        nhwc = channels_last(gm.graph)
        matches = []
        for node in gm.graph.nodes:
            match = softmax(node, nhwc)
            if isinstance(match, str):
                skips.add(match)
            elif match is not None:
                matches.append(match)
        for match in matches:  # decided on the graph as it came, rewritten after
            replace_with(match.node, rewrite(gm, match))
        return PassResult(gm, len(matches), dict(skips))
