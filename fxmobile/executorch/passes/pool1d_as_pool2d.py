"""One-dimensional poolings as the two-dimensional ones ATen computes them with.

    x: [N, C, L] or [C, L]                                    t = reshape(x, [N or 1, C, 1, L])
    avg_pool1d(x, k, s, p, ceil_mode, count_include_pad)
        ->  reshape(avg_pool2d(t, [1, k], [1, s], [0, p], ceil_mode, count_include_pad), out.shape)
    max_pool1d(x, k, s, p, d, ceil_mode)
        ->  reshape(max_pool2d(t, [1, k], [1, s], [0, p], [1, d], ceil_mode), out.shape)
    adaptive_avg_pool1d(x, n)
        ->  reshape(adaptive_avg_pool2d(t, [1, n]), out.shape)

ATen's ``avg_pool1d`` and ``adaptive_avg_pool1d`` are these calls (``unsqueeze(-2)``, the 2-D
pooling, ``squeeze(-2)``); its ``max_pool1d`` has a kernel of its own on the CPU, which takes the
same maximum over the same window, NaN propagating as in ``max_pool2d``. ExecuTorch's lowering
decomposes each into that ``unsqueeze_copy``, pooling and ``squeeze_copy``, and XNNPACK's
partitioner takes neither view (an inner ``unsqueeze`` or any ``squeeze``): each 1-D pooling cut
the delegate in two, as in Next-ViT's attention, which pools its keys with ``nn.AvgPool1d``
(three cuts). Written here, the 2-D pooling is in the graph the later passes see, so an average
pooling that counts its padding or an adaptive one of size 1 is rewritten as any 2-D one is, and
the reshapes are views the partitioner takes. Delegated, a max pooling computes what every 2-D
one the delegate runs computes: -inf for a window holding a NaN, where eager gives NaN (XNNPACK's
kernel; docs/pages/limits.md).

Left alone, with the reason: an input or output whose shape is not known.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import fx

from fxmobile.executorch.passes.aten import argument, aten, call, rewrite_each, shape
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

POOLS_1D = frozenset(
    {aten.avg_pool1d.default, aten.max_pool1d.default, aten.adaptive_avg_pool1d.default}
)


def _one(value: Any, default: int | None = None) -> int:
    """A 1-D pooling's argument (an int, or a list of one) as an int; ``default`` for an empty
    list (a stride not given is the kernel's)."""
    if isinstance(value, list | tuple):
        if not value:
            assert default is not None
            return default
        value = value[0]
    return int(value)


def can_widen(node: fx.Node) -> fx.Node | str | None:
    """``node`` when it is a 1-D pooling to write as a 2-D one, a reason to stay, or None for
    any other node."""
    if node.op != "call_function" or node.target not in POOLS_1D:
        return None
    if shape(node.args[0]) is None or shape(node) is None:
        return "input or output shape unknown (pass example_inputs)"
    return node


def widen(gm: fx.GraphModule, node: fx.Node) -> fx.Node:
    """The 2-D pooling of ``node``'s input with a height of 1, between reshapes, inserted before
    ``node``; its output."""
    graph, x = gm.graph, node.args[0]
    sizes, out = shape(x), shape(node)
    assert sizes is not None and out is not None
    with graph.inserting_before(node):
        # 4-D (an unbatched input gets a batch of 1): the delegate lays out NHWC
        batch = [1] * (3 - len(sizes))
        tall = call(graph, aten.reshape.default, x, [*batch, *sizes[:-1], 1, sizes[-1]])
        pooled = call(graph, *_pool2d(node, tall))
        return call(graph, aten.reshape.default, pooled, list(out))


def _pool2d(node: fx.Node, x: fx.Node) -> tuple[Any, ...]:
    """The 2-D pooling's operator and arguments for the 1-D pooling ``node`` on ``x``."""
    if node.target is aten.adaptive_avg_pool1d.default:
        return aten.adaptive_avg_pool2d.default, x, [1, _one(node.args[1])]
    kernel = _one(node.args[1])
    stride = _one(argument(node, 2, "stride", []), default=kernel)
    padding = _one(argument(node, 3, "padding", 0))
    window = [1, kernel], [1, stride], [0, padding]
    if node.target is aten.max_pool1d.default:
        dilation = _one(argument(node, 4, "dilation", 1))
        ceil_mode = bool(argument(node, 5, "ceil_mode", False))
        return aten.max_pool2d.default, x, *window, [1, dilation], ceil_mode
    ceil_mode = bool(argument(node, 4, "ceil_mode", False))
    count_include_pad = bool(argument(node, 5, "count_include_pad", True))
    return aten.avg_pool2d.default, x, *window, ceil_mode, count_include_pad


class Pool1dAsPool2d(FxPass):
    """Write each 1-D pooling as the 2-D pooling of a height-1 view, as ATen computes it."""

    optimization = MobileOptimizerType.POOL1D_AS_POOL2D
    summary: ClassVar[str] = (
        "avg_pool1d, max_pool1d, adaptive_avg_pool1d -> the 2-D pooling of a height-1 reshape"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        return rewrite_each(gm, can_widen, widen)
