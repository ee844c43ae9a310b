"""Matmuls of activations as the one batched matmul XNNPACK takes.

    c = matmul(a, b)          a: [*B, M, K]   b: [*B, K, N]   the same batch dims B, rank >= 3

    ->  c = reshape(bmm(reshape(a, [n, M, K]), reshape(b, [n, K, N])), [*B, M, N])    n = prod(B)

    c = matmul(a, b)          a: [*A, K]   b: [K, N]   b computed from the inputs

    ->  c = reshape(bmm(reshape(a, [1, m, K]), reshape(b, [1, K, N])), [*A, N])       m = prod(A)

Each entry of ``c`` is the same dot product of a row of ``a`` with a column of ``b``, in the
same batch: the reshapes only regroup the batch dims (their elements stay in order). ATen's
``matmul`` is an implicit op: ExecuTorch decomposes it into ``expand``, ``view`` and ``bmm``
when both sides have batch dims (even when the expand adds nothing: two ``expand_copy`` per
matmul, which XNNPACK has no kernel for, so attention written as ``q @ k.transpose(-2, -1)``
cuts the delegate twice per block), and into ``mm`` when ``b`` is 2-D, which XNNPACK takes only
with a static weight. ``bmm`` XNNPACK takes with activations on both sides.

Not a candidate: a 2-D ``b`` computed from parameters and constants alone (``x @ W``: ``mm`` with
a static weight, which XNNPACK packs once, is faster than a ``bmm``). Left alone, with the
reason: a 1-D operand, batch dims that broadcast (the batched side would have to be copied), a
dtype other than float32, and an operand whose shape is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import (
    aten,
    call,
    dtype,
    input_independent,
    numel,
    rewrite_each,
    shape,
)
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass


@dataclass(frozen=True)
class Matmul:
    """One ``aten.matmul`` call, as a ``bmm`` of ``batch`` matrices."""

    node: fx.Node
    a: fx.Node
    b: fx.Node
    a3: tuple[int, int, int]  # a as [n, M, K]
    b3: tuple[int, int, int]  # b as [n, K, N]
    out: tuple[int, ...]  # the matmul's shape


def can_batch(node: fx.Node) -> Matmul | str | None:
    """The ``bmm`` ``node`` is, a reason it must stay, or None when it is no matmul to take."""
    if node.op != "call_function" or node.target is not aten.matmul.default:
        return None
    a, b = node.args[0], node.args[1]
    assert isinstance(a, fx.Node) and isinstance(b, fx.Node)
    sa, sb, out = shape(a), shape(b), shape(node)
    if sa is None or sb is None or out is None:
        return "input shape unknown (pass example_inputs)"
    if min(len(sa), len(sb)) < 2:
        return "a 1-D operand (a matrix-vector product)"
    if dtype(a) is not torch.float32 or dtype(b) is not torch.float32:
        return f"{dtype(a)} @ {dtype(b)}: the XNNPACK delegate computes float32"
    if len(sb) == 2:
        if input_independent(b):
            return None  # x @ W: mm with a static weight, which XNNPACK takes and packs
        m = numel(sa[:-1])
        return Matmul(node, a, b, (1, m, sa[-1]), (1, *sb), out)
    if sa[:-2] != sb[:-2]:
        return f"batch dims {list(sa[:-2])} and {list(sb[:-2])} broadcast"
    n = numel(sa[:-2])
    return Matmul(node, a, b, (n, *sa[-2:]), (n, *sb[-2:]), out)  # type: ignore[arg-type]


def batch(gm: fx.GraphModule, match: Matmul) -> fx.Node:
    """Insert the ``bmm`` before ``match.node``; its output."""
    graph = gm.graph
    with graph.inserting_before(match.node):
        a, b = match.a, match.b
        if shape(a) != match.a3:
            a = call(graph, aten.reshape.default, a, list(match.a3))
        if shape(b) != match.b3:
            b = call(graph, aten.reshape.default, b, list(match.b3))
        product = call(graph, aten.bmm.default, a, b)
        if (match.a3[0], match.a3[1], match.b3[2]) == match.out:
            return product
        return call(graph, aten.reshape.default, product, list(match.out))


class MatmulAsBmm(FxPass):
    """Write each float32 matmul of activations as ``bmm`` between reshapes."""

    optimization = MobileOptimizerType.MATMUL_AS_BMM
    summary: ClassVar[str] = (
        "matmul(a, b) -> reshape(bmm(reshape(a), reshape(b))), batch dims equal"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_batch, batch)
