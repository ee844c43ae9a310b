"""Selections of parts of a tensor, as the slices and reshapes XNNPACK takes.

    select(x, d, i)                 -> reshape(slice(x, d, i, i + 1), out.shape)
    unbind(x, d)[i]                 -> reshape(slice(x, d, i, i + 1), out.shape)
    split(x, n, d)[i]               -> slice(x, d, start_i, end_i)    (split_with_sizes, chunk too)

``x[:, 0]``, ``q, k, v = qkv.unbind(0)`` and ``a, b = x.chunk(2, 1)`` are each one op that
returns a part of ``x``; a slice of stride 1 returns the same elements, and a reshape drops the
selected dim. ExecuTorch's XNNPACK partitioner has no config for ``select_copy``,
``unbind_copy`` or ``split_with_sizes_copy`` (every timm attention block unbinds q, k and v),
and each one it declines cuts the delegate in two.

Left alone, with the reason: an input or output whose shape is unknown or symbolic, and an
unbind or split whose parts are used other than by indexing.
"""

from __future__ import annotations

import operator
from typing import ClassVar

from torch import fx

from fxmobile.executorch.passes.aten import aten, call, integer, integers, shape
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.graph_utils import replace_node
from fxmobile.passes.stage import FxContext, FxPass

SPLITS = frozenset({aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default})


def _dim(value: object, rank: int) -> int:
    dim = integer(value)
    return dim + rank if dim < 0 else dim


def parts(node: fx.Node) -> list[tuple[int, int, int, bool]] | str | None:
    """For a select, unbind or split: (dim, start, end, drop the dim) per output, a reason to
    stay, or None when ``node`` is none of them."""
    if node.op != "call_function":
        return None
    target = node.target
    if target not in (aten.select.int, aten.unbind.int) and target not in SPLITS:
        return None
    sizes = shape(node.args[0])
    if sizes is None:
        return "input shape unknown or symbolic (pass example_inputs)"
    rank = len(sizes)
    if target is aten.select.int:
        dim = _dim(node.args[1], rank)
        index = integer(node.args[2])
        index = index + sizes[dim] if index < 0 else index
        return [(dim, index, index + 1, True)]
    if any(u.op != "call_function" or u.target is not operator.getitem for u in node.users):
        return "its parts are used other than by indexing"
    if target is aten.unbind.int:
        dim = _dim(node.args[1] if len(node.args) > 1 else 0, rank)
        return [(dim, i, i + 1, True) for i in range(sizes[dim])]
    dim = _dim(node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0), rank)
    lengths = _lengths(node, sizes[dim])
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return [(dim, s, s + n, False) for s, n in zip(starts, lengths, strict=True)]


def _lengths(node: fx.Node, size: int) -> list[int]:
    """The sizes of a split's parts along its dim, as torch computes them."""
    arg = node.args[1]
    if node.target is aten.split_with_sizes.default:
        return integers(arg)
    if node.target is aten.chunk.default:
        chunks = integer(arg)
        step = -(-size // chunks)  # ceil: torch.chunk's part size
    else:
        step = integer(arg)
    return [min(step, size - start) for start in range(0, size, step)]


def _slice(
    gm: fx.GraphModule,
    before: fx.Node,
    source: object,
    part: tuple[int, int, int, bool],
    out: tuple[int, ...],
) -> fx.Node:
    dim, start, end, drop = part
    with gm.graph.inserting_before(before):
        sliced = call(gm.graph, aten.slice.Tensor, source, dim, start, end, 1)
        if drop:
            sliced = call(gm.graph, aten.reshape.default, sliced, list(out))
    return sliced


class SliceSelections(FxPass):
    """Write selects, unbinds and splits as slices (and reshapes)."""

    optimization = MobileOptimizerType.SLICE_SELECTIONS
    summary: ClassVar[str] = "select, unbind, split, chunk -> slice (+ reshape)"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            found = parts(node)
            if isinstance(found, str):
                skips.add(found)
                continue
            if found is None:
                continue
            selected = [node] if node.target is aten.select.int else list(node.users)
            outs = [shape(n) for n in selected]
            if any(out is None for out in outs):
                skips.add("output shape unknown or symbolic (pass example_inputs)")
                continue
            for part_node, out in zip(selected, outs, strict=True):
                index = 0 if part_node is node else integer(part_node.args[1])
                assert out is not None
                replace_node(part_node, _slice(gm, part_node, node.args[0], found[index], out))
            if selected != [node]:  # an unbind or split, its parts rerouted
                gm.graph.erase_node(node)
            rewrites += 1
        return PassResult(gm, rewrites, dict(skips))
