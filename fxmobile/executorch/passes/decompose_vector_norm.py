"""A vector's 2-norm written as the ops XNNPACK takes, since it takes none of the norm's own.

    linalg_vector_norm(x, 2, dims, keepdim)  ->  sqrt(sum(x * x, dims, keepdim))

ExecuTorch lowers ``linalg_vector_norm`` to ``pow(x, 2.0)``, ``sum`` and ``pow(s, 0.5)``, and
XNNPACK takes none of the three (a power that is a float; no config for ``sum``). So
``F.normalize`` (EdgeNeXt's cross-covariance attention normalizes its queries and keys) runs on
portable kernels between two delegate calls: 18 of EdgeNeXt-xx-small's ops. Written as a
product, a sum and a square root, the sum becomes a matmul in ``decompose_mean`` (the next
pass but two), and XNNPACK takes all three.

ATen's kernel sums the same squares without scaling them, so the result differs only by the
order of the sum; a NaN gives NaN, an infinity inf, and a square past the float range inf, as
in eager.

Not a candidate: an order other than 2. Left alone, with the reason: a ``dtype=`` argument, a
dtype other than float32, an input whose shape is unknown, a dim out of range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import (
    argument,
    aten,
    call,
    dtype,
    reduced_dims,
    rewrite_each,
    shape,
)
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass


@dataclass(frozen=True)
class Norm:
    """One 2-norm, ``node``, of ``source`` over ``dims``."""

    node: fx.Node
    source: fx.Node
    dims: tuple[int, ...]
    keepdim: bool


def can_decompose(node: fx.Node) -> Norm | str | None:
    """The 2-norm ``node`` is, a reason it must stay, or None when it is none."""
    if node.op != "call_function" or node.target is not aten.linalg_vector_norm.default:
        return None
    if argument(node, 1, "ord", 2) != 2:
        return None  # another order: no sum of squares
    source = node.args[0]
    assert isinstance(source, fx.Node)
    sizes = shape(source)
    if sizes is None:
        return "input shape unknown (pass example_inputs)"
    if argument(node, 4, "dtype") is not None:
        return "a dtype= argument"
    if dtype(source) is not torch.float32:
        return f"{dtype(source)} input: the XNNPACK delegate computes float32"
    dims = reduced_dims(argument(node, 2, "dim"), len(sizes))
    if dims is None:
        return "a dim out of range"
    return Norm(node, source, dims, bool(argument(node, 3, "keepdim", False)))


def decompose(gm: fx.GraphModule, match: Norm) -> fx.Node:
    """Insert ``sqrt(sum(x * x))`` before the norm; its output."""
    graph, x = gm.graph, match.source
    with graph.inserting_before(match.node):
        squares = call(graph, aten.mul.Tensor, x, x)
        summed = call(graph, aten.sum.dim_IntList, squares, list(match.dims), match.keepdim)
        return call(graph, aten.sqrt.default, summed)


class DecomposeVectorNorm(FxPass):
    """Write each float32 2-norm as a product, a sum and a square root."""

    optimization = MobileOptimizerType.DECOMPOSE_VECTOR_NORM
    summary: ClassVar[str] = "linalg_vector_norm(x, 2) -> sqrt(sum(x * x)): XNNPACK takes those"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_decompose, decompose)
