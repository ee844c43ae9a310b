"""Nearest upsampling as a depthwise transposed convolution with ones, and a strided slice.

    y = upsample_nearest2d(x, [fh * H, fw * W])       x: [N, C, H, W], fh and fw whole numbers
                                                      (an output size, or scale factors)

    ->  y = conv_transpose2d(x, J, stride=[fh, fw], groups=C)       J = ones([C, 1, fh, fw])

    y = upsample_nearest2d(x, [OH, OW])               OH = fh * H / sh, g = gcd(H, OH),
                                                      fh = OH / g, sh = H / g (so for W)

    ->  y = conv_transpose2d(x, J, stride=[fh, fw], groups=C)[:, :, ::sh, ::sw]

With a kernel as large as its stride, a transposed convolution writes each input pixel
``x[n, c, h, w]`` times the kernel into the block ``y[n, c, fh*h : fh*(h+1), fw*w : fw*(w+1)]``,
and the blocks do not overlap: each output is ``x * 1`` of the one pixel nearest upsampling
copies there, exactly, NaN and infinities included. ExecuTorch's XNNPACK partitioner has no
config for ``upsample_nearest2d`` (YOLO's neck and U-Net decoders upsample this way, each one a
portable kernel between two delegate calls), and takes a depthwise transposed convolution with
a constant weight.

Where the output is no whole multiple of the input (timm's GhostNetV2 gates its 7 x 7 maps with
a 3 x 3 one, pooled by 2 and upsampled back: 3 -> 7 reads rows 0 0 0 1 1 2 2), output row ``i``
reads input row ``floor(i * H / OH)`` = ``floor(sh * i / fh)``, which is row ``sh * i`` of the
upsampling by ``fh``: the slice takes every ``sh``-th row of it, and ``strided_slices`` then
writes that slice in ops XNNPACK runs. The upsampling by ``fh`` is ``sh`` times the output in
that dim, so a step over ``MAX_STEP`` is left to the portable kernel.

Whether the op copies row ``h`` to rows ``fh*h .. fh*h + fh - 1`` of the upsampling the slice
takes from is proven, not assumed: ATen picks the source row with floating-point arithmetic on
the scale (``floor(i * scale)``), so the check runs the op itself on a picture of each pixel's
index, with the call's own arguments, and compares.

Left alone, with the reason: a step over ``MAX_STEP``, a dtype other than float32, an input whose
shape is unknown, and a mapping that differs from whole-block copies.
"""

from __future__ import annotations

import math
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
MAX_STEP = 4  # rows of the whole-factor upsampling per output row, each dim


@dataclass(frozen=True)
class Upsample:
    """One nearest upsampling, as one by whole factors and a slice of every (sh, sw)-th."""

    node: fx.Node
    source: fx.Node
    channels: int
    factors: tuple[int, int]  # (fh, fw)
    steps: tuple[int, int]  # (sh, sw): 1 where the output is a whole multiple


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
    if h == 0 or w == 0 or oh == 0 or ow == 0:
        return "an empty input or output"
    if any(isinstance(a, fx.Node) for a in [*node.args[1:], *node.kwargs.values()]):
        return "output size computed at run time"
    (fh, sh), (fw, sw) = _factor_and_step(h, oh), _factor_and_step(w, ow)
    if max(sh, sw) > MAX_STEP:
        return (
            f"{h}x{w} -> {oh}x{ow}: a slice of steps {sh}x{sw} of an upsampling by {fh}x{fw} "
            f"(a step over {MAX_STEP} makes more than it saves)"
        )
    if h * w >= _EXACT_INDICES:
        return "too many pixels to check the mapping"
    if not _copies_blocks(node, h, w, (fh, fw), (sh, sw)):
        return "the op's scale does not copy whole blocks (ATen rounds its source index)"
    return Upsample(node, source, channels, (fh, fw), (sh, sw))


def _factor_and_step(size: int, out: int) -> tuple[int, int]:
    """(f, s): ``out`` rows are every s-th row of ``size`` upsampled by f (f * size / s = out)."""
    common = math.gcd(size, out)
    return out // common, size // common


def _copies_blocks(
    node: fx.Node, h: int, w: int, factors: tuple[int, int], steps: tuple[int, int]
) -> bool:
    """Whether ``node``'s op, with its own arguments, gives every (sh, sw)-th pixel of the
    picture that copies pixel (i, j) to the block at (fh*i, fw*j): run on a picture of pixel
    indices, it gives each index repeated, strided."""
    index = torch.arange(h * w, dtype=torch.float32).reshape(1, 1, h, w)
    with torch.no_grad():
        got = node.target(index, *node.args[1:], **node.kwargs)  # type: ignore[operator]
    blocks = index.repeat_interleave(factors[0], dim=2).repeat_interleave(factors[1], dim=3)
    return bool(torch.equal(got, blocks[:, :, :: steps[0], :: steps[1]]))


def convolve(gm: fx.GraphModule, match: Upsample) -> fx.Node:
    """Insert the transposed convolution (and the slices) before ``match.node``; its output."""
    (fh, fw), sizes = match.factors, shape(match.source)
    assert sizes is not None  # can_convolve read it
    with gm.graph.inserting_before(match.node):
        ones = constant(gm, "upsample_ones", torch.ones(match.channels, 1, fh, fw))
        y = call(
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
        for dim, factor, step in ((2, fh, match.steps[0]), (3, fw, match.steps[1])):
            if step > 1:
                y = call(gm.graph, aten.slice.Tensor, y, dim, 0, factor * sizes[dim], step)
        return y


class UpsampleNearestAsConvTranspose(FxPass):
    """Write each float32 nearest upsampling as a depthwise transposed conv by whole factors,
    and a strided slice of it where the output is no whole multiple of the input."""

    optimization = MobileOptimizerType.UPSAMPLE_NEAREST_AS_CONV_TRANSPOSE
    summary: ClassVar[str] = (
        "upsample_nearest2d(x, f) -> conv_transpose2d(x, ones[C,1,f,f], stride=f, groups=C), "
        "then [::s] where H*f/s is the output"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_convolve, convolve)
