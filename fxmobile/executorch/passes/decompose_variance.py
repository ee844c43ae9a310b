"""A variance (or a standard deviation) written as the means and products XNNPACK takes.

    var(x, dims, correction=c, keepdim)  ->  sum(d * d, dims, keepdim) * 1/(N - c)
                                             d = x - mean(x, dims, keepdim=True)
    std(x, dims, correction=c, keepdim)  ->  sqrt(the same)
                                             N = the number of elements each reduces

XNNPACK has no variance, and ExecuTorch lowers ``var`` to a portable kernel between two delegate
calls: timm's EvoNorm (``regnetz_c16_evos``: 68 of them) and the RMS-normalized ConvNeXts
(``convnext_zepto_rms``: 15). The mean and the sum become matmuls or a global pooling in
``decompose_mean`` (the next pass), the rest is elementwise.

ATen's kernel is the same two passes over the data (Welford's update per element, then the sum
of squared deviations): the result differs by rounding only. A NaN anywhere in a line gives NaN
for it, as in eager, and so does an infinity (``inf - inf``), where eager's Welford gives NaN
too.

Left alone, with the reason: a ``correction`` as large as ``N`` (eager divides by zero or less),
a dtype other than float32, an input whose shape is unknown, a dim out of range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import (
    argument,
    aten,
    call,
    constant,
    float32_shape,
    numel,
    reduced_dims,
    rewrite_each,
    shape,
)
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

# (dim, unbiased, keepdim) by position; correction and keepdim by keyword; (unbiased) alone
POSITIONAL = frozenset({aten.var.dim, aten.std.dim})
KEYWORDS = frozenset({aten.var.correction, aten.std.correction})
WHOLE = frozenset({aten.var.default, aten.std.default})
ROOTS = frozenset({aten.std.dim, aten.std.correction, aten.std.default})
VARIANCES = POSITIONAL | KEYWORDS | WHOLE


@dataclass(frozen=True)
class Variance:
    """One variance (``root``: a standard deviation), ``node``, of ``source`` over ``dims``,
    its sum of squares divided by ``divisor``."""

    node: fx.Node
    source: fx.Node
    dims: tuple[int, ...]
    keepdim: bool
    divisor: float
    root: bool


def can_decompose(node: fx.Node) -> Variance | str | None:
    """The variance ``node`` is, a reason it must stay, or None when it is none."""
    target = node.target
    if node.op != "call_function" or target not in VARIANCES:
        return None
    source = node.args[0]
    assert isinstance(source, fx.Node)
    sizes = float32_shape(source)
    if isinstance(sizes, str):
        return sizes
    if target in WHOLE:
        dims: tuple[int, ...] | None = tuple(range(len(sizes)))
        correction, keepdim = float(bool(argument(node, 1, "unbiased", True))), False
    else:
        dims = reduced_dims(argument(node, 1, "dim"), len(sizes))
        if target in POSITIONAL:
            correction = float(bool(argument(node, 2, "unbiased", True)))
            keepdim = bool(argument(node, 3, "keepdim", False))
        else:
            found: Any = node.kwargs.get("correction")
            correction = 1.0 if found is None else float(found)
            keepdim = bool(node.kwargs.get("keepdim", False))
    if dims is None:
        return "a dim out of range"
    count = numel([sizes[d] for d in dims])
    if count - correction <= 0:
        return f"correction {correction:g} of {count} elements: eager divides by zero or less"
    return Variance(node, source, dims, keepdim, count - correction, target in ROOTS)


def decompose(gm: fx.GraphModule, match: Variance) -> fx.Node:
    """Insert the means, products and the scale before the variance; its output."""
    graph, x, dims = gm.graph, match.source, list(match.dims)
    with graph.inserting_before(match.node):
        mean = call(graph, aten.mean.dim, x, dims, True)
        deviation = call(graph, aten.sub.Tensor, x, mean)
        squares = call(graph, aten.mul.Tensor, deviation, deviation)
        summed = call(graph, aten.sum.dim_IntList, squares, dims, match.keepdim)
        scale = constant(gm, "variance_scale", _scale(1.0 / match.divisor, shape(match.node)))
        variance = call(graph, aten.mul.Tensor, summed, scale)
        return call(graph, aten.sqrt.default, variance) if match.root else variance


def _scale(value: float, out: tuple[int, ...] | None) -> torch.Tensor:
    """The factor as a one-element float32 constant: 0-d for a 0-d variance (``x.var()``),
    whose shape a one-element vector would broadcast to (1,)."""
    return torch.tensor(value if out == () else [value], dtype=torch.float32)


class DecomposeVariance(FxPass):
    """Write each float32 variance and standard deviation as means, products and a scale."""

    optimization = MobileOptimizerType.DECOMPOSE_VARIANCE
    summary: ClassVar[str] = "var(x) -> sum(d * d) / (N - c), d = x - mean(x); std its sqrt"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_decompose, decompose)
