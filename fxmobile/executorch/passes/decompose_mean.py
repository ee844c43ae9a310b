"""Means and sums XNNPACK declines, as the global pool, matmuls and reshapes it takes.

    mean(x, [2, 3])  x: [N, C, H, W], keepdim False    ->  reshape(mean(x, [2, 3], keepdim), [N, C])
    sum(x, [2, 3])   x: [N, C, H, W]                   ->  the same mean, times H * W
    adaptive_avg_pool2d(x, [1, 1])  x: [N, C, H, W]    ->  mean(x, [2, 3], keepdim)   x permuted

    mean or sum over other dims: x viewed as [A, D, Z], each run of adjacent reduced dims in
    turn (the last first): D their elements, A those before, Z those after, w = 1/D (a mean) or
    1 (a sum)

        Z = 1 (the run ends the shape):  linear(reshape(x, [A, D]), full([1, D], w))    [A, 1]
        Z > 1:                           bmm(full([A, 1, D], w), reshape(x, [A, D, Z]))  [A, 1, Z]

    and a reshape to the op's output (keepdim or not; ``x.mean()`` and ``x.sum()`` reduce every
    dim).

    adaptive_avg_pool2d(x, [h, w])  H = h*kh, W = w*kw  ->  the mean of x viewed as
                                                            [N, C, h, kh, w, kw] over kh and kw
    adaptive_avg_pool1d(x, [l])     L = l*k             ->  the mean of x viewed as
                                                            [N, C, l, k] over k
    avg_pool2d(x, k)  one window, the whole input       ->  mean(x, [2, 3], keepdim)
        (output 1 x 1, k >= H and k >= W, padding 0: the window is clipped to the input and
        divides by its H * W elements, ceil_mode or not)

Each run holds the same number of elements per output, so the mean of the runs' means is the
mean; the matmuls multiply by constants (1/D or 1) and add, as the mean does. ExecuTorch's
XNNPACK partitioner takes ``mean.dim`` only over the two innermost dims of a 4-D tensor, kept,
and has no config for ``sum`` or for ``_adaptive_avg_pool2d`` to other than 1 x 1: the others
run on portable kernels between two delegate calls (a ``x.mean(1)`` over tokens in LeViT's and
EfficientFormer's heads, ``x.mean((2, 3))`` in ShuffleNet's). ``adaptive_avg_pool2d`` to 1 x 1
of a permuted tensor (ConvNeXt's, Swin's and EdgeNeXt's heads) becomes an ``as_strided_copy``
in ExecuTorch's own lowering; as ``mean.dim`` it is a global pool. A pool of a contiguous tensor
ExecuTorch makes that ``mean`` itself, and is left to it (a rewrite would cost another export),
unless the graph holds a copy ``remove_layout_copies`` may drop: its input's strides at the last
export are then not the ones recorded here (MobileNetV4's hybrid head pools a conv of its
attention's transposed output, and kept an ``as_strided_copy``). An
``avg_pool2d`` whose one window is the whole input is a global pool too: Hugging Face's
EfficientNet head, ``AvgPool2d(1280, ceil_mode=True)`` over 7 x 7, which XNNPACK declines
(ceil_mode) and the portable kernel took about 7.5 s a call for. ``adaptive_avg_pool1d``, which
export keeps (Hugging Face's Swin pools its tokens with ``AdaptiveAvgPool1d(1)`` of the
transposed sequence), ExecuTorch makes an ``unsqueeze_copy``, a pool and a ``squeeze_copy``, none
of them delegated.

The forms are measured (ExecuTorch's runtime, one thread): a mean over the last dim of
[1, 196, 384] as ``linear`` 0.12 ms, as ``mean.dim`` of a [rows, 1, 1, C] view 0.22 ms (the
portable kernel 0.10 ms); over the tokens of [1, 49, 448] as ``bmm`` 0.034 ms, as ``linear`` of
the transpose 0.087 ms (portable 0.10 ms). None goes through ``avg_pool2d``, whose XNNPACK
kernel turns a NaN into -inf: here a NaN or an infinity reaches the outputs it reaches in eager.

Not a candidate: a 4-D ``mean`` over [2, 3] kept (XNNPACK takes it), and an adaptive pool to
1 x 1 of a contiguous tensor in a graph without layout copies. Left alone, with the
reason: a ``dtype=`` argument, a dtype other than float32, an input whose shape is unknown, an
empty input, an adaptive pool whose output does not divide the input, and a ``bmm`` weight of
more than ``MAX_WEIGHTS`` elements.
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
    contiguous,
    dtype,
    numel,
    reduced_dims,
    rewrite_each,
    shape,
)
from fxmobile.executorch.passes.remove_layout_copies import LayoutCopy, can_remove
from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

REDUCTIONS = frozenset({aten.mean.dim, aten.sum.dim_IntList})
WHOLE = frozenset({aten.mean.default, aten.sum.default})  # over every dim, to a 0-d tensor
MEANS = frozenset({aten.mean.dim, aten.mean.default})
ADAPTIVE = frozenset({aten.adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d.default})
ADAPTIVE_1D = aten.adaptive_avg_pool1d.default
POOL = aten.avg_pool2d.default
MAX_WEIGHTS = 1 << 16  # elements of a bmm's constant weight, [A, 1, D]


@dataclass(frozen=True)
class Reduction:
    """One mean, sum or adaptive pool, as a reduction of ``view`` over ``dims``."""

    node: fx.Node
    source: fx.Node
    view: tuple[int, ...]  # the input, viewed so that the reduced dims are whole dims
    dims: tuple[int, ...]  # of ``view``, sorted
    mean: bool  # a mean (else a sum)
    out: tuple[int, ...]
    global_pool: bool  # the 4-D mean.dim over [2, 3], kept, that XNNPACK takes


def can_decompose(node: fx.Node, layout_copies: bool = True) -> Reduction | str | None:
    """The reduction ``node`` is, a reason it must stay, or None when it is none to rewrite.
    ``layout_copies``: whether the graph holds a copy ``remove_layout_copies`` may drop (then
    no recorded stride holds at the last export)."""
    target = node.target
    if node.op != "call_function" or not (
        target in REDUCTIONS
        or target in WHOLE
        or target in ADAPTIVE
        or target is ADAPTIVE_1D
        or target is POOL
    ):
        return None
    source = node.args[0]
    assert isinstance(source, fx.Node)
    sizes, out = shape(source), shape(node)
    if sizes is None or out is None:
        return "input shape unknown (pass example_inputs)"
    if not sizes:
        return None  # a reduction of a 0-d tensor is the tensor
    if target is POOL and not one_whole_window(node, sizes, out):
        return None  # a pool of windows, XNNPACK's average pool
    if (
        argument(node, 3, "dtype") if target in REDUCTIONS else node.kwargs.get("dtype")
    ) is not None:
        return "a dtype= argument"
    if dtype(source) is not torch.float32:
        return f"{dtype(source)} input: the XNNPACK delegate computes float32"
    if numel(sizes) == 0:
        return "an empty input"
    if target in ADAPTIVE:
        return _adaptive(node, source, sizes, out, layout_copies)
    if target is ADAPTIVE_1D:
        return _adaptive_1d(node, source, sizes, out)
    if target is POOL:
        if argument(node, 6, "divisor_override") is not None:
            return "a divisor_override: not the mean"
        return Reduction(node, source, sizes, (2, 3), True, out, global_pool=True)
    dims = reduced_dims(argument(node, 1, "dim") if target in REDUCTIONS else None, len(sizes))
    assert dims is not None  # torch checked them when the model ran
    mean = target in MEANS
    global_pool = len(sizes) == 4 and dims == (2, 3)
    if global_pool and mean and target in REDUCTIONS and argument(node, 2, "keepdim", False):
        return None  # XNNPACK's global average pool takes it as it is
    found = Reduction(node, source, sizes, dims, mean, out, global_pool)
    return _weights_fit(found)


def one_whole_window(node: fx.Node, sizes: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether ``avg_pool2d`` ``node`` averages one window that holds the whole input: a 4-D
    input, a 1 x 1 output, a kernel at least the input's size and no padding."""
    if len(sizes) != 4 or out[2:] != (1, 1):
        return False
    kernel, padding = (
        _pair(argument(node, 1, "kernel_size")),
        _pair(argument(node, 3, "padding", 0)),
    )
    return kernel[0] >= sizes[2] and kernel[1] >= sizes[3] and padding == (0, 0)


def _pair(value: int | list[int] | tuple[int, ...]) -> tuple[int, int]:
    """A pooling size as ATen takes it (one int, or one or two of them) as (height, width)."""
    if isinstance(value, int):
        return value, value
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


def _adaptive(
    node: fx.Node,
    source: fx.Node,
    sizes: tuple[int, ...],
    out: tuple[int, ...],
    layout_copies: bool,
) -> Reduction | str | None:
    if len(sizes) != 4:
        return f"a {len(sizes)}-D input (4-D taken)"
    n, c, h, w = sizes
    oh, ow = out[2:]
    if h % oh or w % ow:
        return f"{h}x{w} -> {oh}x{ow}: the output does not divide the input"
    if (oh, ow) == (1, 1):
        if contiguous(source) and not layout_copies:
            return None  # ExecuTorch makes it the global pool XNNPACK takes
        return Reduction(node, source, sizes, (2, 3), True, out, global_pool=True)
    view = (n, c, oh, h // oh, ow, w // ow)
    return _weights_fit(Reduction(node, source, view, (3, 5), True, out, global_pool=False))


def _adaptive_1d(
    node: fx.Node, source: fx.Node, sizes: tuple[int, ...], out: tuple[int, ...]
) -> Reduction | str:
    length, pooled = sizes[-1], out[-1]
    if length % pooled:
        return f"{length} -> {pooled}: the output does not divide the input"
    view = (*sizes[:-1], pooled, length // pooled)
    return _weights_fit(Reduction(node, source, view, (len(view) - 1,), True, out, False))


def _weights_fit(found: Reduction) -> Reduction | str:
    """``found``, or the reason one of its ``bmm`` weights is too large."""
    if found.global_pool:
        return found
    for start, stop in runs(found.dims):
        before, after = numel(found.view[:start]), numel(found.view[stop:])
        weights = before * numel(found.view[start:stop])
        if after > 1 and weights > MAX_WEIGHTS:
            return f"a bmm weight of {weights} elements (over {MAX_WEIGHTS})"
    return found


def runs(dims: tuple[int, ...]) -> list[tuple[int, int]]:
    """The runs of adjacent dims in sorted ``dims``, as [start, stop) ranges, the last first."""
    found: list[tuple[int, int]] = []
    for d in dims:
        if found and found[-1][1] == d:
            found[-1] = (found[-1][0], d + 1)
        else:
            found.append((d, d + 1))
    return found[::-1]


def decompose(gm: fx.GraphModule, match: Reduction) -> fx.Node:
    """Insert the decomposition before ``match.node``; its output."""
    graph = gm.graph
    with graph.inserting_before(match.node):
        y, sizes = match.source, list(match.view)
        if match.global_pool:
            y = _reshape(graph, y, match.view)
            y = call(graph, aten.mean.dim, y, [2, 3], True)
            if not match.mean:  # a sum: the mean times H * W
                count = torch.tensor([float(numel(match.view[2:]))])
                y = call(graph, aten.mul.Tensor, y, constant(gm, "sum_count", count))
            got: tuple[int, ...] = (*match.view[:2], 1, 1)
        else:
            got = match.view
            for start, stop in runs(match.dims):
                y, got = _reduce(gm, y, got, sizes, start, stop, match.mean)
                sizes[start:stop] = []
        return _reshape(graph, y, match.out, got)


def _reshape(
    graph: fx.Graph, x: fx.Node, sizes: tuple[int, ...], known: tuple[int, ...] | None = None
) -> fx.Node:
    """``x`` reshaped to ``sizes``, unless its shape (``known``, or recorded) is that."""
    if (known if known is not None else shape(x)) == tuple(sizes):
        return x
    return call(graph, aten.reshape.default, x, list(sizes))


def _reduce(
    gm: fx.GraphModule,
    x: fx.Node,
    known: tuple[int, ...],
    sizes: list[int],
    start: int,
    stop: int,
    mean: bool,
) -> tuple[fx.Node, tuple[int, ...]]:
    """``x`` (of shape ``known``, read as ``sizes``) reduced over dims [start, stop): the
    result, [A, 1] or [A, 1, Z], and its shape."""
    graph = gm.graph
    before, count, after = numel(sizes[:start]), numel(sizes[start:stop]), numel(sizes[stop:])
    weight = 1.0 / count if mean else 1.0
    if after == 1:
        rows = _reshape(graph, x, (before, count), known)
        w = constant(gm, "mean_weight", torch.full((1, count), weight))
        return call(graph, aten.linear.default, rows, w), (before, 1)
    w = constant(gm, "mean_weight", torch.full((before, 1, count), weight))
    rows = _reshape(graph, x, (before, count, after), known)
    return call(graph, aten.bmm.default, w, rows), (before, 1, after)


class DecomposeMean(FxPass):
    """Write each float32 mean, sum, adaptive average pool and average pool to 1 x 1 XNNPACK
    declines (or gets wrong) in ops it takes."""

    optimization = MobileOptimizerType.DECOMPOSE_MEAN
    summary: ClassVar[str] = (
        "mean/sum over dims, adaptive_avg_pool1d/2d, a whole-input avg_pool2d -> mean.dim "
        "over [2, 3] kept, or matmuls by 1/D"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        copies = any(isinstance(can_remove(n), LayoutCopy) for n in gm.graph.nodes)
        return rewrite_each(gm, lambda node: can_decompose(node, copies), decompose)
