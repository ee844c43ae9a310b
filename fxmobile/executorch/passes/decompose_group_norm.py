"""GroupNorm in the ops XNNPACK runs, each mean in two stages: over a channel, then a group.

    y = group_norm(x, G, w, b, eps)            x: [N, C, *S], P = prod(S) pixels, K = C / G

    ->  mean(t) = reshape(linear(reshape(linear(reshape(t, [N*C, P]), J_P), [N*G, K]), J_K),
                          [N, G, 1])           J_n = full([1, n], 1/n): a mean as a matmul
        v   = reshape(x, [N, G, K*P])
        d   = v - mean(v)
        y   = d * rsqrt(mean(d * d) + eps)     the biased variance, as group_norm computes it
        y   = reshape(reshape(y, [N, C, P]) * w[C, 1] + b[C, 1], x.shape)    (if given)

Every channel of a group has P pixels, so the mean of the channels' means is the group's mean.
Reducing in two stages keeps each sum short: PoolFormer normalizes 64 x 56 x 56 = 200 704
values per group (``GroupNorm(1, C)``), and one long sum of that size, the ``mean.dim`` form
and ExecuTorch's own portable kernel alike, ends up 2.5e-5 of the output's scale off float64;
the two stages stay at 2e-7, and run faster (measured in ExecuTorch's runtime, one thread:
1.13 ms against 2.6 ms for one ``mean.dim`` over the group and 2.5 ms for the portable kernel on
[1, 64, 56, 56] with G = 1; 0.20 ms against 0.25 and 0.37 ms on [1, 256, 14, 14] with G = 8).
ExecuTorch's XNNPACK partitioner has no config for ``native_group_norm``, so each GroupNorm
otherwise runs on a portable kernel between two delegate calls (PoolFormer-S12: 24).

Two passes over the group (the mean, then the variance of the differences), as ATen's kernel:
no ``E[x²] - E[x]²`` cancellation. A NaN or an infinity in a group makes every output of that
group NaN, as in eager.

Left alone, with the reason: a dtype other than float32 (the XNNPACK delegate computes
float32), and an input whose shape is not known.
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
    constant,
    float32_shape,
    numel,
    rewrite_each,
)
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass


@dataclass(frozen=True)
class GroupNorm:
    """One ``aten.group_norm`` call, understood."""

    node: fx.Node
    source: fx.Node
    sizes: tuple[int, ...]  # the input's shape
    groups: int  # G
    pixels: int  # P: elements per channel
    weight: fx.Node | None
    bias: fx.Node | None
    eps: float

    @property
    def batch(self) -> int:
        return self.sizes[0]

    @property
    def channels(self) -> int:
        return self.sizes[1]


def can_decompose(node: fx.Node) -> GroupNorm | str | None:
    """The GroupNorm ``node`` computes, a reason it must stay, or None when it is none."""
    if node.op != "call_function" or node.target is not aten.group_norm.default:
        return None
    source = node.args[0]
    assert isinstance(source, fx.Node)
    sizes = float32_shape(source)
    if isinstance(sizes, str):
        return sizes
    weight, bias = argument(node, 2, "weight"), argument(node, 3, "bias")
    return GroupNorm(
        node=node,
        source=source,
        sizes=sizes,
        groups=int(argument(node, 1, "num_groups")),
        pixels=numel(sizes[2:]),
        weight=weight if isinstance(weight, fx.Node) else None,
        bias=bias if isinstance(bias, fx.Node) else None,
        eps=float(argument(node, 4, "eps", 1e-5)),
    )


def decompose(gm: fx.GraphModule, match: GroupNorm) -> fx.Node:
    """Insert the decomposition before ``match.node``; its output."""
    graph = gm.graph
    n, c, g, p = match.batch, match.channels, match.groups, match.pixels
    k = c // g
    with graph.inserting_before(match.node):
        # a stage over one element is none (a GroupNorm of [N, C] has one pixel per channel)
        per_pixel = (
            constant(gm, "group_norm_pixel_mean", torch.full((1, p), 1.0 / p)) if p > 1 else None
        )
        per_channel = (
            constant(gm, "group_norm_channel_mean", torch.full((1, k), 1.0 / k)) if k > 1 else None
        )

        def mean(t: fx.Node) -> fx.Node:
            """``t`` ([N, G, K*P]): the mean of each group, [N, G, 1]."""
            rows = call(graph, aten.reshape.default, t, [n * c, p])
            if per_pixel is not None:
                rows = call(graph, aten.linear.default, rows, per_pixel)
            rows = call(graph, aten.reshape.default, rows, [n * g, k])
            if per_channel is not None:
                rows = call(graph, aten.linear.default, rows, per_channel)
            return call(graph, aten.reshape.default, rows, [n, g, 1])

        v = call(graph, aten.reshape.default, match.source, [n, g, k * p])
        d = call(graph, aten.sub.Tensor, v, mean(v))
        var = mean(call(graph, aten.mul.Tensor, d, d))
        eps = constant(gm, "group_norm_eps", torch.tensor([match.eps], dtype=torch.float32))
        rstd = call(graph, aten.rsqrt.default, call(graph, aten.add.Tensor, var, eps))
        y = call(graph, aten.reshape.default, call(graph, aten.mul.Tensor, d, rstd), [n, c, p])
        if match.weight is not None:
            w = call(graph, aten.reshape.default, match.weight, [c, 1])
            y = call(graph, aten.mul.Tensor, y, w)
        if match.bias is not None:
            b = call(graph, aten.reshape.default, match.bias, [c, 1])
            y = call(graph, aten.add.Tensor, y, b)
        return call(graph, aten.reshape.default, y, list(match.sizes))


class DecomposeGroupNorm(FxPass):
    """Write each float32 ``group_norm`` as matmuls and elementwise ops XNNPACK takes."""

    optimization = MobileOptimizerType.DECOMPOSE_GROUP_NORM
    summary: ClassVar[str] = (
        "group_norm(x) -> (x - mean) * rsqrt(var + eps) * w + b, means per channel then group"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_decompose, decompose)
