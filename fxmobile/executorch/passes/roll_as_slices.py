"""``torch.roll`` by static shifts, as the slices and concatenation XNNPACK takes.

    y = roll(x, s, d)        ->  y = cat([x[n-k:n], x[0:n-k]], d)       n = x.shape[d], k = s mod n
    y = roll(x, [s, t], [d, e])  ->  the same along d, then along e
    y = roll(x, s)           ->  reshape(roll(reshape(x, [N]), s, 0), x.shape)   (no dims: flat)

``roll`` moves each element ``k`` places along ``d``, the last ``k`` coming round to the front:
exactly the two parts concatenated in the other order, a copy of every element and no
arithmetic (NaN and infinities move with the rest). A shift that is a multiple of ``n`` moves
nothing and is left out. ExecuTorch decomposes ``roll`` into ``arange``, ``add``, ``fmod`` and
``index_select`` on int64 indices, which XNNPACK has no kernel for: Swin's shifted windows roll
twice per block. The two parts are always two different slices, so XNNPACK's concatenation,
which counts its distinct inputs (``cat([y, y])`` is declined as one tensor), takes it.

Left alone, with the reason: an input whose shape is unknown or symbolic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import fx

from fxmobile.executorch.passes.aten import (
    argument,
    aten,
    call,
    numel,
    positive_dim,
    rewrite_each,
    shape,
    slice_of,
)
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass


@dataclass(frozen=True)
class Roll:
    """One ``aten.roll`` call, understood."""

    node: fx.Node
    source: fx.Node
    sizes: tuple[int, ...]  # the input's shape
    flat: bool  # no dims: the roll is over the flattened tensor
    moves: tuple[tuple[int, int], ...]  # (dim, k) per dim that moves, k in 1..n-1


def can_roll(node: fx.Node) -> Roll | str | None:
    """The roll ``node`` computes, a reason to stay, or None when ``node`` is no roll."""
    if node.op != "call_function" or node.target is not aten.roll.default:
        return None
    source = node.args[0]
    assert isinstance(source, fx.Node)
    sizes = shape(source)
    if sizes is None:
        return "input shape unknown or symbolic (pass example_inputs)"
    shifts = list(argument(node, 1, "shifts"))
    dims = list(argument(node, 2, "dims", []))
    flat = not dims
    lengths = (numel(sizes),) if flat else sizes
    moves = []
    for shift, dim in zip(shifts, dims or [0], strict=True):
        d = positive_dim(dim, len(lengths))
        k = int(shift) % lengths[d] if lengths[d] else 0
        if k:
            moves.append((d, k))
    return Roll(node, source, sizes, flat, tuple(moves))


def roll(gm: fx.GraphModule, match: Roll) -> fx.Node:
    """The slices and concatenations of ``match``, inserted before its node; their output."""
    graph = gm.graph
    with graph.inserting_before(match.node):
        x = match.source
        if match.flat:
            x = call(graph, aten.reshape.default, x, [numel(match.sizes)])
        lengths = (numel(match.sizes),) if match.flat else match.sizes
        for d, k in match.moves:
            n = lengths[d]
            parts = [slice_of(graph, x, d, n - k, n), slice_of(graph, x, d, 0, n - k)]
            x = call(graph, aten.cat.default, parts, d)
        if match.flat:
            x = call(graph, aten.reshape.default, x, list(match.sizes))
        if x is match.source:  # nothing moves: a copy of the input
            x = call(graph, aten.clone.default, x)
    return x


class RollAsSlices(FxPass):
    """Write each ``roll`` with static shifts as slices and a concatenation per rolled dim."""

    optimization = MobileOptimizerType.ROLL_AS_SLICES
    summary: ClassVar[str] = "roll(x, k, d) -> cat([x[n-k:], x[:n-k]], d)"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_roll, roll)
