"""Reflect and replicate padding, as slices of one element and a concatenation XNNPACK takes.

    y = pad(x, [l, r], "reflect")      ->  cat([x[l], ..., x[1], x, x[n-2], ..., x[n-1-r]], d)
    y = pad(x, [l, r], "replicate")    ->  cat([x[0], ... (l times), x, x[n-1], ... (r times)], d)

    x[i] = slice(x, d, i, i + 1), n = x.shape[d], d the last dim; the next pair of the padding
    pads the dim before it, on the result (``[l, r, t, b]``: width, then height)

Reflect padding puts the elements next to each border in mirror order around it (the border
element itself not repeated), replicate padding repeats the border element: each padded element
is a copy of one element of ``x``, so the concatenation of those one-element slices with ``x``
is the same tensor, exactly (a NaN or an infinity is copied like any number). Both paddings
are separable, so padding one dim after the other gives the corners too. ExecuTorch decomposes
them into ``arange``, ``abs``, ``sub`` and ``index`` on int64 indices, which XNNPACK has no
kernel for (ten portable ops for one ``ReflectionPad2d``); XNNPACK takes constant padding as it
is. Every part is a slice node of its own, even where two copy the same element, since XNNPACK's
concatenation counts its distinct inputs (``cat([y, y])`` is declined as one tensor).

Matched: ``aten.pad`` with mode ``"reflect"`` or ``"replicate"`` (what ``F.pad`` and
``nn.ReflectionPad2d`` export to) and ``aten.reflection_pad{1,2,3}d`` /
``aten.replication_pad{1,2,3}d``. Left alone, with the reason: a negative pad (a crop), a
reflect pad as wide as its dim, and an input whose shape is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import fx

from fxmobile.executorch.passes.aten import (
    argument,
    aten,
    call,
    rewrite_each,
    shape,
    slice_of,
)
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

MODES = {
    aten.reflection_pad1d.default: "reflect",
    aten.reflection_pad2d.default: "reflect",
    aten.reflection_pad3d.default: "reflect",
    aten.replication_pad1d.default: "replicate",
    aten.replication_pad2d.default: "replicate",
    aten.replication_pad3d.default: "replicate",
}


@dataclass(frozen=True)
class Pad:
    """One reflect or replicate padding, understood."""

    node: fx.Node
    source: fx.Node
    reflect: bool  # else replicate
    sides: tuple[tuple[int, int, int], ...]  # (dim, before, after) per padded dim, last first
    sizes: tuple[int, ...]  # the input's shape


def can_slice(node: fx.Node) -> Pad | str | None:
    """The padding ``node`` computes, a reason to stay, or None when it is no reflect or
    replicate padding."""
    if node.op != "call_function":
        return None
    if node.target is aten.pad.default:
        mode = argument(node, 2, "mode", "constant")
        if mode not in ("reflect", "replicate"):
            return None
    elif node.target in MODES:
        mode = MODES[node.target]
    else:
        return None
    source = node.args[0]
    assert isinstance(source, fx.Node)
    sizes = shape(source)
    if sizes is None:
        return "input shape unknown or symbolic (pass example_inputs)"
    pads = [int(p) for p in node.args[1]]  # type: ignore[union-attr, arg-type]
    if any(p < 0 for p in pads):
        return "a negative pad (a crop)"
    sides = []
    for i in range(len(pads) // 2):
        dim, before, after = len(sizes) - 1 - i, pads[2 * i], pads[2 * i + 1]
        if mode == "reflect" and max(before, after) >= sizes[dim]:
            return "a reflect pad as wide as its dim"
        if before or after:
            sides.append((dim, before, after))
    return Pad(node, source, mode == "reflect", tuple(sides), sizes)


def pad(gm: fx.GraphModule, match: Pad) -> fx.Node:
    """The slices and concatenations of ``match``, inserted before its node; their output."""
    graph = gm.graph
    with graph.inserting_before(match.node):
        x: fx.Node = match.source
        for dim, before, after in match.sides:
            n = match.sizes[dim]
            if match.reflect:
                first = [before - i for i in range(before)]  # x[l], ..., x[1]
                last = [n - 2 - i for i in range(after)]  # x[n-2], ..., x[n-1-r]
            else:
                first, last = [0] * before, [n - 1] * after
            parts = [slice_of(graph, x, dim, i, i + 1) for i in first]
            parts.append(x)
            parts += [slice_of(graph, x, dim, i, i + 1) for i in last]
            x = call(graph, aten.cat.default, parts, dim)
        if x is match.source:  # no pad at all: a copy of the input
            x = call(graph, aten.clone.default, x)
    return x


class PadAsSlices(FxPass):
    """Write each reflect or replicate padding as slices of its border and a concatenation."""

    optimization = MobileOptimizerType.PAD_AS_SLICES
    summary: ClassVar[str] = "pad(x, reflect | replicate) -> cat([x[i:i+1]..., x, ...])"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_slice, pad)
