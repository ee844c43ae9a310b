"""``unfold`` into windows that neither overlap nor skip, as a reshape, a permute and a reshape.

    im2col(x, kernel=[kh, kw], dilation=[1, 1], padding=[ph, pw], stride=[kh, kw])
        x: [*B, C, H, W]                                         B: no dim, or one
    ->  p = constant_pad_nd(x, [pw, pw, ph, ph], 0)              only with padding
        p = p[..., :Hb·kh, :Wb·kw]                               only where a window does not fit
        reshape(permute(reshape(p, [*B, C, Hb, kh, Wb, kw]), [*B, C, kh, kw, Hb, Wb]),
                [*B, C·kh·kw, Hb·Wb])                            Hb = (H + 2ph) // kh, likewise Wb

``F.unfold`` (``nn.Unfold``) whose stride is its kernel cuts the (zero-padded) image into
kh x kw tiles and lays tile (i, j)'s element (c, u, v) at row c·kh·kw + u·kw + v, column i·Wb + j;
the reshape, permute and reshape move each element to that place, and a tile that would reach
past the image is dropped as ATen drops it. Only elements move, so every value, a NaN or an
infinity included, comes out where eager puts it. ExecuTorch decomposes ``im2col`` into
``arange``, ``add``, ``unsqueeze`` and a gather (``index``) that XNNPACK has no kernel for:
TNT's pixel embedding (``nn.Unfold(kernel_size=4, stride=4)``) was ten portable ops and a cut.

Left alone, with the reason: windows that overlap or skip elements (a stride other than the
kernel, a dilation), and an input whose shape is not known.
"""

from __future__ import annotations

from typing import ClassVar

from torch import fx

from fxmobile.executorch.passes.aten import aten, call, integers, rewrite_each, shape
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass


def can_permute(node: fx.Node) -> fx.Node | str | None:
    """``node`` when it is an ``im2col`` of tiles, a reason to stay, or None for any other
    node."""
    if node.op != "call_function" or node.target is not aten.im2col.default:
        return None
    kernel, dilation, _, stride = (integers(arg) for arg in node.args[1:5])
    if stride != kernel or dilation != [1, 1]:
        return "windows overlap or skip elements (XNNPACK has no gather)"
    if shape(node.args[0]) is None or shape(node) is None:
        return "input or output shape unknown (pass example_inputs)"
    return node


def permute(gm: fx.GraphModule, node: fx.Node) -> fx.Node:
    """The tiles of ``node``'s input moved into its columns, inserted before ``node``; the
    result."""
    graph, x = gm.graph, node.args[0]
    sizes, out = shape(x), shape(node)
    assert sizes is not None and out is not None
    (kh, kw), (ph, pw) = integers(node.args[1]), integers(node.args[3])
    *lead, channels, height, width = sizes
    rows, columns = (height + 2 * ph) // kh, (width + 2 * pw) // kw
    with graph.inserting_before(node):
        if ph or pw:
            x = call(graph, aten.constant_pad_nd.default, x, [pw, pw, ph, ph], 0.0)
        for dim, (size, keep) in enumerate(
            [(height + 2 * ph, rows * kh), (width + 2 * pw, columns * kw)], start=len(sizes) - 2
        ):
            if keep != size:
                x = call(graph, aten.slice.Tensor, x, dim, 0, keep, 1)
        tiles = call(graph, aten.reshape.default, x, [*lead, channels, rows, kh, columns, kw])
        first = len(lead)
        order = [*range(first + 1), first + 2, first + 4, first + 1, first + 3]
        moved = call(graph, aten.permute.default, tiles, order)
        return call(graph, aten.reshape.default, moved, list(out))


class UnfoldAsPermute(FxPass):
    """Write each ``unfold`` into non-overlapping tiles as a reshape, permute and reshape."""

    optimization = MobileOptimizerType.UNFOLD_AS_PERMUTE
    summary: ClassVar[str] = "unfold(x, k, stride=k) -> reshape(permute(reshape(x))): tiles moved"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_permute, permute)
