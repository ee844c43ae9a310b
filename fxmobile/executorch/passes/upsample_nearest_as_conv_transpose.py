"""Nearest upsampling by whole factors as a depthwise transposed convolution with ones.

    y = upsample_nearest2d(x, [fh * H, fw * W])       x: [N, C, H, W], fh and fw whole numbers
                                                      (an output size, or scale factors)

    ->  y = conv_transpose2d(x, J, stride=[fh, fw], groups=C)       J = ones([C, 1, fh, fw])

With a kernel as large as its stride, a transposed convolution writes each input pixel
``x[n, c, h, w]`` times the kernel into the block ``y[n, c, fh*h : fh*(h+1), fw*w : fw*(w+1)]``,
and the blocks do not overlap: each output is ``x * 1`` of the one pixel nearest upsampling
copies there, exactly, NaN and infinities included. ExecuTorch's XNNPACK partitioner has no
config for ``upsample_nearest2d`` (YOLO's neck and U-Net decoders upsample this way, each one a
portable kernel between two delegate calls), and takes a depthwise transposed convolution with
a constant weight.

Whether the op copies row ``h`` to output rows ``fh*h .. fh*h + fh - 1`` is proven, not assumed:
ATen picks the source row with floating-point arithmetic on the scale (``floor(i * scale)``),
so the check runs the op itself on a picture of each pixel's index, with the call's own
arguments, and compares.

Left alone, with the reason: an output size that is not a whole multiple of the input's, a
dtype other than float32, an input whose shape is unknown, and a mapping that differs from
whole-block copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import aten, call, constant, dtype, rewrite_each, shape
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

NEAREST = frozenset({aten.upsample_nearest2d.vec, aten.upsample_nearest2d.default})
_EXACT_INDICES = 1 << 24  # float32 holds every pixel index below this


@dataclass(frozen=True)
class Upsample:
    """One nearest upsampling by whole factors."""

    node: fx.Node
    source: fx.Node
    channels: int
    factors: tuple[int, int]  # (fh, fw)


def can_convolve(node: fx.Node) -> Upsample | str | None:
    """The upsampling ``node`` is, a reason it must stay, or None when it is none."""
    if node.op != "call_function" or node.target not in NEAREST:
        return None
    source = node.args[0]
    assert isinstance(source, fx.Node)
    sizes, out = shape(source), shape(node)
    if sizes is None or out is None:
        return "input shape unknown (pass example_inputs)"
    if dtype(source) is not torch.float32:
        return f"{dtype(source)} input: the XNNPACK delegate computes float32"
    (_, channels, h, w), (oh, ow) = sizes, out[2:]
    if h == 0 or w == 0 or oh % h or ow % w:
        return f"{h}x{w} -> {oh}x{ow} is not by whole factors"
    if any(isinstance(a, fx.Node) for a in [*node.args[1:], *node.kwargs.values()]):
        return "output size computed at run time"
    if h * w >= _EXACT_INDICES:
        return "too many pixels to check the mapping"
    if not _copies_blocks(node, h, w, oh // h, ow // w):
        return "the op's scale does not copy whole blocks (ATen rounds its source index)"
    return Upsample(node, source, channels, (oh // h, ow // w))


def _copies_blocks(node: fx.Node, h: int, w: int, fh: int, fw: int) -> bool:
    """Whether ``node``'s op, with its own arguments, copies pixel (i, j) to the block at
    (fh*i, fw*j): run on a picture of pixel indices, it gives each index repeated."""
    index = torch.arange(h * w, dtype=torch.float32).reshape(1, 1, h, w)
    with torch.no_grad():
        got = node.target(index, *node.args[1:], **node.kwargs)  # type: ignore[operator]
    blocks = index.repeat_interleave(fh, dim=2).repeat_interleave(fw, dim=3)
    return bool(torch.equal(got, blocks))


def convolve(gm: fx.GraphModule, match: Upsample) -> fx.Node:
    """Insert the transposed convolution before ``match.node``; its output."""
    fh, fw = match.factors
    with gm.graph.inserting_before(match.node):
        ones = constant(gm, "upsample_ones", torch.ones(match.channels, 1, fh, fw))
        return call(
            gm.graph,
            aten.conv_transpose2d.input,
            match.source,
            ones,
            None,  # bias
            [fh, fw],  # stride
            [0, 0],  # padding
            [0, 0],  # output_padding
            match.channels,  # groups
            [1, 1],  # dilation
        )


class UpsampleNearestAsConvTranspose(FxPass):
    """Write each float32 nearest upsampling by whole factors as a depthwise transposed conv."""

    optimization = MobileOptimizerType.UPSAMPLE_NEAREST_AS_CONV_TRANSPOSE
    summary: ClassVar[str] = (
        "upsample_nearest2d(x, f) -> conv_transpose2d(x, ones[C,1,f,f], stride=f, groups=C)"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_convolve, convolve)
