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

The partitioner declines every pooling with ``ceil_mode`` too. Where rounding the output size up
adds no window (each size is even for ResNet-D's ``AvgPool2d(2, 2, ceil_mode=True,
count_include_pad=False)`` shortcuts at 224 x 224), ATen pools the same windows with the same
divisors either way, and the flag goes.

Left alone, with the reason: a ``ceil_mode`` that adds a last window (it can reach past the
input and the padding, and ATen divides it by less), a ``divisor_override`` (the partitioner
takes it only as the window's size), and a dtype other than float32 or an input whose shape is
not known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import argument, aten, call, dtype, rewrite_each, shape
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass


def _pair(value: object) -> tuple[int, int]:
    """A pooling argument (an int, or a list of one or two) as (height, width)."""
    if isinstance(value, int):
        return value, value
    assert isinstance(value, list | tuple) and len(value) in (1, 2), value
    return (int(value[0]), int(value[-1]))


@dataclass(frozen=True)
class Pool:
    """An average pooling to rewrite without ``ceil_mode``: the (height, width) padding to move
    into a pad, or None to keep it."""

    node: fx.Node
    padding: tuple[int, int] | None


def _window(node: fx.Node) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """``node``'s pooling kernel, stride (the kernel's when not given) and padding, each as
    (height, width)."""
    kernel = _pair(node.args[1])
    stride = argument(node, 2, "stride", [])
    return kernel, _pair(stride) if stride else kernel, _pair(argument(node, 3, "padding", 0))


def _floor_sizes(node: fx.Node, sizes: tuple[int, ...]) -> tuple[int, int]:
    """The output height and width of ``node``'s pooling without ``ceil_mode``."""
    kernel, steps, padding = _window(node)
    return (
        (sizes[-2] + 2 * padding[0] - kernel[0]) // steps[0] + 1,
        (sizes[-1] + 2 * padding[1] - kernel[1]) // steps[1] + 1,
    )


def rewrite_of(node: fx.Node) -> Pool | str | None:
    """What to rewrite of ``node``'s pooling, a reason to stay, or None when ``node`` is no
    average pooling the partitioner declines for its padding or its ``ceil_mode``."""
    if node.op != "call_function" or node.target is not aten.avg_pool2d.default:
        return None
    padding = _pair(argument(node, 3, "padding", 0))
    move = padding != (0, 0) and argument(node, 5, "count_include_pad", True)
    ceil_mode = bool(argument(node, 4, "ceil_mode", False))
    if not move and not ceil_mode:
        return None  # the partitioner takes it as it is
    found, sizes, out = dtype(node.args[0]), shape(node.args[0]), shape(node)
    if found is None or sizes is None or out is None:
        return "dtype or shape unknown (pass example_inputs)"
    if ceil_mode and _floor_sizes(node, sizes) != out[-2:]:
        return "ceil_mode adds a last window, which may reach past the input with a smaller divisor"
    if move and argument(node, 6, "divisor_override", None) is not None:
        return "divisor_override: the XNNPACK delegate divides by the window's size only"
    if found is not torch.float32:
        return f"{found} input: the XNNPACK delegate computes float32"
    return Pool(node, padding if move else None)


def rewrite(gm: fx.GraphModule, pool: Pool) -> fx.Node:
    """The pooling without ``ceil_mode``, of the zero-padded input when its padding moves,
    inserted before ``pool.node``; its output."""
    node, x = pool.node, pool.node.args[0]
    kernel, stride, padding = (list(pair) for pair in _window(node))
    keep = [argument(node, 5, "count_include_pad", True), argument(node, 6, "divisor_override")]
    with gm.graph.inserting_before(node):
        if pool.padding is not None:
            pad_h, pad_w = pool.padding
            x = call(gm.graph, aten.constant_pad_nd.default, x, [pad_w, pad_w, pad_h, pad_h], 0.0)
            padding, keep = [0, 0], [True, None]
        return call(gm.graph, aten.avg_pool2d.default, x, kernel, stride, padding, False, *keep)


class AvgPoolPaddingAsPad(FxPass):
    """Write an average pooling that counts its zero padding as a pad and a pooling, and drop
    a ``ceil_mode`` that adds no window."""

    optimization = MobileOptimizerType.AVG_POOL_PADDING_AS_PAD
    summary: ClassVar[str] = (
        "avg_pool2d(x, p, count_include_pad) -> avg_pool2d(pad(x, p), 0); a ceil_mode that "
        "adds no window -> dropped"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, rewrite_of, rewrite)
