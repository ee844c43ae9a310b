"""Average pooling that counts its zero padding, as a constant pad and a pooling without any.

    avg_pool2d(x, k, s, p, ceil_mode=False, count_include_pad=True)
    ->  avg_pool2d(constant_pad_nd(x, [p_w, p_w, p_h, p_h], 0), k, s, 0)

With ``count_include_pad`` (the default of ``nn.AvgPool2d`` and ``F.avg_pool2d``) every window
divides by ``k_h * k_w``, the padded zeros counted; without ``ceil_mode`` no window reaches past
the padding, so ATen's divisor is that product for every window. Pooling the zero-padded input
with no padding sums the same elements and divides by the same product. The zeros add nothing to
a NaN or an infinity, so those reach the same outputs. ExecuTorch's XNNPACK partitioner declines
an ``avg_pool2d`` that counts non-zero padding (XNNPACK's pooling leaves padding out of the
average), so torchvision's Inception-v3 was cut into ten delegate calls by its nine branch pools
and MaxViT by the pools of its downsampling blocks; a constant pad and a pooling without padding
it takes.

Left alone, with the reason: ``ceil_mode`` (a last window can then reach past the padding, and
ATen divides it by less), a ``divisor_override`` (the partitioner takes it only as the window's
size), and a dtype other than float32 or an input whose shape is not known.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import argument, aten, call, dtype, replace_with, shape
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass


def _pair(value: object) -> tuple[int, int]:
    """A pooling argument (an int, or a list of one or two) as (height, width)."""
    if isinstance(value, int):
        return value, value
    assert isinstance(value, list | tuple) and len(value) in (1, 2), value
    return (int(value[0]), int(value[-1]))


def padding_to_move(node: fx.Node) -> tuple[int, int] | str | None:
    """The (height, width) padding to move into a pad, a reason to stay, or None when ``node``
    is no average pooling that counts a non-zero padding."""
    if node.op != "call_function" or node.target is not aten.avg_pool2d.default:
        return None
    padding = _pair(argument(node, 3, "padding", 0))
    if padding == (0, 0) or not argument(node, 5, "count_include_pad", True):
        return None  # the partitioner takes it as it is
    if argument(node, 4, "ceil_mode", False):
        return "ceil_mode: its last window can reach past the padding, with a smaller divisor"
    if argument(node, 6, "divisor_override", None) is not None:
        return "divisor_override: the XNNPACK delegate divides by the window's size only"
    found = dtype(node.args[0])
    if found is None or shape(node.args[0]) is None:
        return "dtype or shape unknown (pass example_inputs)"
    if found is not torch.float32:
        return f"{found} input: the XNNPACK delegate computes float32"
    return padding


class AvgPoolPaddingAsPad(FxPass):
    """Write an average pooling that counts its zero padding as a pad and a pooling."""

    optimization = MobileOptimizerType.AVG_POOL_PADDING_AS_PAD
    summary: ClassVar[str] = "avg_pool2d(x, p, count_include_pad) -> avg_pool2d(pad(x, p), 0)"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            found = padding_to_move(node)
            if isinstance(found, str):
                skips.add(found)
            elif found is not None:
                (pad_h, pad_w), x = found, node.args[0]
                kernel = list(_pair(node.args[1]))
                stride = argument(node, 2, "stride", [])
                stride = list(_pair(stride)) if stride else kernel
                with gm.graph.inserting_before(node):
                    padded = call(
                        gm.graph, aten.constant_pad_nd.default, x, [pad_w, pad_w, pad_h, pad_h], 0.0
                    )
                    pooled = call(gm.graph, aten.avg_pool2d.default, padded, kernel, stride, [0, 0])
                replace_with(node, pooled)
                rewrites += 1
        return PassResult(gm, rewrites, dict(skips))
