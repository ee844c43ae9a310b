"""Broadcasts left to the ops that broadcast anyway, or done by a multiplication with ones.

    op(expand(x, S), y)    ->  op(x, y)       op broadcasts its operands (add, sub, mul, div,
                                              maximum, minimum, where), and its output keeps its
                                              shape: broadcast(x, y) = broadcast(S, y)
    expand(x, S)           ->  mul(x, J)      otherwise, x float32; J = ones of S with 1 on each
                                              dim x already has whole: x * 1 = x for every float
                                              (NaN, infinities and -0 included), broadcast to S

Expanding only repeats elements (no new values), and a broadcasting op repeats them itself, the
same way: a size-1 dim of ``x`` (or one it lacks, on the left) is stretched to the other
operand's size. ExecuTorch's XNNPACK partitioner has no config for ``expand_copy``, so each
one runs on a portable kernel between two delegate calls: ``x / norm.expand_as(x)`` in
``F.normalize`` (EdgeNeXt), ``cls_token.expand(B, -1, -1)`` (ViT). XNNPACK's elementwise ops
broadcast at any rank it takes.

``J`` has an element per element the expand adds, not per element of its output (a [1, 1, C]
token expanded to [B, 1, C] multiplies by ones of [B, 1, 1]). A ``J`` of more than ``MAX_ONES``
elements (256 KiB of float32) is split over its dims into factors of at most that many, one
multiplication each (EvoNorm's group statistics, [1, G, 1, 1, 1] expanded to
[1, G, 16, 128, 128], multiply by ones of [1, 1, 16, 128, 1] and of [1, 1, 1, 1, 128]); a single
dim over ``MAX_ONES`` leaves the expand as it is.

Not a candidate: an expand that adds no element (``reshape_views`` makes it a reshape). Left
alone, with the reason: an output or input shape that is unknown, a tensor of a dtype other than
float32 that some user does not broadcast, and a dim of ``J`` over ``MAX_ONES``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import aten, call, constant, dtype, numel, shape
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

# Ops whose tensor operands broadcast against each other, and how many leading arguments are
# those operands.
BROADCASTING = {
    aten.add.Tensor: 2,
    aten.sub.Tensor: 2,
    aten.mul.Tensor: 2,
    aten.div.Tensor: 2,
    aten.maximum.default: 2,
    aten.minimum.default: 2,
    aten.where.self: 3,
}
MAX_ONES = 1 << 16  # elements of the ones constant a fallback may add


def broadcasts(node: fx.Node, expand: fx.Node) -> bool:
    """Whether ``node`` computes the same with ``expand``'s input in its place: it broadcasts
    its operands, reads ``expand`` only among them, and its output keeps its shape."""
    operands = BROADCASTING.get(node.target)  # type: ignore[call-overload]
    if node.op != "call_function" or operands is None:
        return False
    if expand in node.args[operands:] or expand in node.kwargs.values():
        return False
    source = expand.args[0]
    sizes = []
    for arg in node.args[:operands]:
        arg = source if arg is expand else arg
        if isinstance(arg, fx.Node):
            found = shape(arg)
            if found is None:
                return False
            sizes.append(found)
    try:
        return tuple(torch.broadcast_shapes(*sizes)) == shape(node)
    except RuntimeError:
        return False


def ones_shape(source: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the ones that broadcast ``source`` to ``out`` by a multiplication: the
    output's size where ``source`` has a 1 or no dim, 1 where it has the whole dim."""
    lead = len(out) - len(source)
    return tuple(size if i < lead or source[i - lead] != size else 1 for i, size in enumerate(out))


def factors(ones: tuple[int, ...]) -> list[tuple[int, ...]] | None:
    """``ones`` split over its dims, in order, into shapes of at most ``MAX_ONES`` elements
    whose product broadcasts to it; None when a single dim is larger."""
    found: list[tuple[int, ...]] = []
    current = [1] * len(ones)
    for dim, size in enumerate(ones):
        if size > MAX_ONES:
            return None
        if numel(current) * size > MAX_ONES:
            found.append(tuple(current))
            current = [1] * len(ones)
        current[dim] = size
    return [*found, tuple(current)]


def can_remove(node: fx.Node) -> tuple[list[fx.Node], list[tuple[int, ...]]] | str | None:
    """For a broadcasting expand: the users that broadcast it themselves, and the shapes of the
    ones the others need multiplied by (none when there are no others); a reason to stay; None
    when ``node`` is no such expand."""
    if node.op != "call_function" or node.target is not aten.expand.default:
        return None
    source = node.args[0]
    assert isinstance(source, fx.Node)
    sizes, out = shape(source), shape(node)
    if sizes is None or out is None:
        return "input or output shape unknown (pass example_inputs)"
    if numel(sizes) == numel(out):
        return None  # a no-op expand: reshape_views'
    # A 0-d tensor takes part in type promotion as a number, an expanded one as a tensor.
    broadcasting = [u for u in node.users if sizes and broadcasts(u, node)]
    if len(broadcasting) == len(node.users):
        return broadcasting, []
    if dtype(node) is not torch.float32:
        return (
            f"{dtype(node)} expand used other than by a broadcasting op "
            "(a multiplication by ones would be float32)"
        )
    ones = ones_shape(sizes, out)
    split = factors(ones)
    if split is None:
        return f"ones of a dim over {MAX_ONES} elements for a multiplication"
    return broadcasting, split


def remove(
    gm: fx.GraphModule, node: fx.Node, users: list[fx.Node], ones: list[tuple[int, ...]]
) -> None:
    """Route ``users`` to the expand's input, and the rest to ``input * ones...``; erase it."""
    source = node.args[0]
    for user in users:
        user.replace_input_with(node, source)  # type: ignore[arg-type]
    if ones:
        product = source
        with gm.graph.inserting_before(node):
            for factor in ones:
                by = constant(gm, "expand_ones", torch.ones(factor, dtype=torch.float32))
                product = call(gm.graph, aten.mul.Tensor, product, by)
        assert isinstance(product, fx.Node)
        product.meta.update(node.meta)
        node.replace_all_uses_with(product)
    gm.graph.erase_node(node)


class RemoveExpands(FxPass):
    """Drop broadcasting expands whose users broadcast; multiply by ones where they do not."""

    optimization = MobileOptimizerType.REMOVE_EXPANDS
    summary: ClassVar[str] = "op(expand(x), y) -> op(x, y); other expand(x) -> x * ones"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            found = can_remove(node)
            if isinstance(found, str):
                skips.add(found)
            elif found is not None:
                remove(gm, node, *found)
                rewrites += 1
        return PassResult(gm, rewrites, dict(skips))
