"""Slices with a step, as a reshape that puts the step in a dim of its own and a slice of step 1.

    y = x[a:b:s] along d               m = len(range(a, b, s)) elements, a = q*s + r (0 <= r < s)

    ->  z = x[q*s : (q+m)*s]           (step 1; or x padded with zeros to (q+m)*s elements when
                                        the dim is shorter: the padding is never selected)
        y = reshape(reshape(z, [..., m, s, ...])[..., :, r:r+1, ...], y.shape)

Row ``k`` of ``reshape(z, [m, s])`` holds ``x[(q+k)*s .. (q+k)*s + s-1]``; its column ``r`` is
``x[a + k*s]``, the ``k``-th element the strided slice selects. So the result is the same
elements, copied: exact, NaN and infinities included. XNNPACK's slice takes only a step of 1
(it declines the others without saying why), so ``x[:, ::2, ::2]`` (LeViT's and Swin's
downsampling, EdgeNeXt's positional encoding) runs on a portable kernel between two delegate
calls. When the dim has fewer than ``(q+m)*s`` elements (``x[::2]`` of 7 takes 4 elements, rows
of 2 need 8) the dim is padded at its end with zeros, which ``constant_pad_nd`` adds and XNNPACK
takes: a padded element is past the last one selected, in no column ``r`` of a whole row.

Left alone, with the reason: an input or output whose shape is unknown, and an empty result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import fx

from fxmobile.executorch.passes.aten import (
    argument,
    aten,
    call,
    positive_dim,
    rewrite_each,
    shape,
    slice_of,
)
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass


@dataclass(frozen=True)
class StridedSlice:
    """One ``aten.slice`` with a step, understood."""

    node: fx.Node
    source: fx.Node
    sizes: tuple[int, ...]  # the input's shape
    dim: int
    step: int
    row: int  # q: the first row of ``step`` elements read
    column: int  # r: the column selected in each row
    count: int  # m: elements selected
    out: tuple[int, ...]


def can_restride(node: fx.Node) -> StridedSlice | str | None:
    """The strided slice ``node`` is, a reason to stay, or None when it is no slice with a
    step."""
    if node.op != "call_function" or node.target is not aten.slice.Tensor:
        return None
    step = int(argument(node, 4, "step", 1))
    if step == 1:
        return None
    source = node.args[0]
    assert isinstance(source, fx.Node)
    sizes, out = shape(source), shape(node)
    if sizes is None or out is None:
        return "input shape unknown or symbolic (pass example_inputs)"
    dim = positive_dim(argument(node, 1, "dim", 0), len(sizes))
    start, end, _ = slice(
        argument(node, 2, "start", None), argument(node, 3, "end", None), step
    ).indices(sizes[dim])
    count = len(range(start, end, step))
    if count == 0:
        return "an empty result"
    return StridedSlice(node, source, sizes, dim, step, start // step, start % step, count, out)


def restride(gm: fx.GraphModule, match: StridedSlice) -> fx.Node:
    """The reshapes and slices of step 1, inserted before ``match.node``; their output."""
    graph = gm.graph
    d, s, q, m = match.dim, match.step, match.row, match.count
    lead, trail = list(match.sizes[:d]), list(match.sizes[d + 1 :])
    needed = (q + m) * s
    with graph.inserting_before(match.node):
        x: fx.Node = match.source
        if needed > match.sizes[d]:  # rows of ``s`` need more elements than the dim has
            pads = [0, 0] * len(trail) + [0, needed - match.sizes[d]]
            x = call(graph, aten.constant_pad_nd.default, x, pads, 0.0)
        if q > 0 or needed < match.sizes[d]:
            x = slice_of(graph, x, d, q * s, needed)
        rows = call(graph, aten.reshape.default, x, [*lead, m, s, *trail])
        column = slice_of(graph, rows, d + 1, match.column, match.column + 1)
        return call(graph, aten.reshape.default, column, list(match.out))


class StridedSlices(FxPass):
    """Write each slice with a step as reshapes around a slice of step 1."""

    optimization = MobileOptimizerType.STRIDED_SLICES
    summary: ClassVar[str] = "x[a:b:s] -> reshape(x[..], [m, s])[:, r:r+1] reshaped"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_restride, restride)
