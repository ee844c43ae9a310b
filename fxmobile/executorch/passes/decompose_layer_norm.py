"""LayerNorm in the ops XNNPACK runs, so the delegate does not stop at every norm.

    y = layer_norm(x, S, w, b, eps)            S: the last k dims of x, M = prod(S) elements

    ->  x2  = reshape(x, [*lead, M])
        mu  = linear(x2, J)                    J = full([1, M], 1/M): the mean, as a matmul
        d   = x2 - mu
        var = linear(d * d, J)                 the biased variance, as layer_norm computes it
        y   = reshape(d * rsqrt(var + eps) * w + b, x.shape)      (w, b as [M], if given)

ExecuTorch's XNNPACK partitioner has no config for ``native_layer_norm``, so each LayerNorm of a
transformer runs on a portable kernel between two delegate calls (DeiT-small: 25 of them). The
mean is a ``linear`` with a constant ``1/M`` weight, not ``mean.dim``: XNNPACK takes ``mean.dim``
only over the two innermost dims of a 4-D tensor, kept, as a global average pool over a
channels-last copy of the input; the fully-connected op reads the rows as they are, at any rank.
Two passes over the row (the mean, then the variance of the differences), as ATen's kernel does:
no ``E[x²] - E[x]²`` cancellation. A NaN or infinity in a row makes every output of that row NaN,
as in eager.

Left alone, with the reason: a dtype other than float32 (the XNNPACK delegate computes float32),
and an input whose shape is not known (no example inputs ran).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import (
    aten,
    call,
    constant,
    float32_shape,
    numel,
    rewrite_each,
)
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass


@dataclass(frozen=True)
class LayerNorm:
    """One ``aten.layer_norm`` call, understood."""

    node: fx.Node
    source: fx.Node
    sizes: tuple[int, ...]  # the input's shape
    lead: tuple[int, ...]  # its dims before the normalized ones
    normalized: int  # M: elements normalized together
    weight: fx.Node | None
    bias: fx.Node | None
    eps: float


def can_decompose(node: fx.Node) -> LayerNorm | str | None:
    """The LayerNorm ``node`` computes, a reason it must stay, or None when it is none."""
    if node.op != "call_function" or node.target is not aten.layer_norm.default:
        return None
    source, normalized_shape = node.args[0], node.args[1]
    weight = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
    bias = node.args[3] if len(node.args) > 3 else node.kwargs.get("bias")
    eps = node.args[4] if len(node.args) > 4 else node.kwargs.get("eps", 1e-5)
    assert isinstance(source, fx.Node)
    sizes = float32_shape(source)
    if isinstance(sizes, str):
        return sizes
    lead = sizes[: len(sizes) - len(normalized_shape)]  # type: ignore[arg-type]
    return LayerNorm(
        node=node,
        source=source,
        sizes=sizes,
        lead=lead,
        normalized=numel(sizes[len(lead) :]),
        weight=weight if isinstance(weight, fx.Node) else None,
        bias=bias if isinstance(bias, fx.Node) else None,
        eps=float(eps),  # type: ignore[arg-type]
    )


def decompose(gm: fx.GraphModule, match: LayerNorm) -> fx.Node:
    """Insert the decomposition before ``match.node``; its output."""
    graph = gm.graph
    m = match.normalized
    with graph.inserting_before(match.node):
        mean_weight = constant(gm, "layer_norm_mean", torch.full((1, m), 1.0 / m))
        x = call(graph, aten.reshape.default, match.source, [*match.lead, m])
        mu = call(graph, aten.linear.default, x, mean_weight)
        d = call(graph, aten.sub.Tensor, x, mu)
        var = call(graph, aten.linear.default, call(graph, aten.mul.Tensor, d, d), mean_weight)
        eps = constant(gm, "layer_norm_eps", torch.tensor([match.eps], dtype=torch.float32))
        rstd = call(graph, aten.rsqrt.default, call(graph, aten.add.Tensor, var, eps))
        y = call(graph, aten.mul.Tensor, d, rstd)
        if match.weight is not None:
            y = call(
                graph, aten.mul.Tensor, y, call(graph, aten.reshape.default, match.weight, [m])
            )
        if match.bias is not None:
            y = call(graph, aten.add.Tensor, y, call(graph, aten.reshape.default, match.bias, [m]))
        return call(graph, aten.reshape.default, y, list(match.sizes))


class DecomposeLayerNorm(FxPass):
    """Write each float32 ``layer_norm`` as matmuls and elementwise ops XNNPACK takes."""

    optimization = MobileOptimizerType.DECOMPOSE_LAYER_NORM
    summary: ClassVar[str] = (
        "layer_norm(x) -> (x - mean) * rsqrt(var + eps) * w + b, means as matmuls"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_decompose, decompose)
