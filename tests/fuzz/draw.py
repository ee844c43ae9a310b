"""Random eager models for differential fuzzing: hypothesis strategies that only draw valid ones.

``model_specs()`` draws each block (``tests.fuzz.spec``) from the type of the value that reaches
it (channels, spatial sizes, dtype), so every model is valid by construction, nothing is drawn
and then filtered:

- a conv's (stride, dilation, kernel, padding) per spatial dim is drawn from the combinations
  that fit that dim: the dilated kernel fits the padded input, reflect padding is narrower than
  the input, circular padding no wider, the output is 1..``SPATIAL_CAP``; ``padding="same"``
  only with stride 1; a transposed conv's ``output_padding`` is below its stride or dilation;
- groups divide the input channels (depthwise included), output channels are a multiple of them;
- a BatchNorm has the input's channels and the rank its class accepts; one that normalizes by
  batch statistics (``track_running_stats=False``) only sees more than one value per channel;
- a residual add / mul / sub takes an earlier value of the same type, a ``cat`` one of the same
  spatial size; a module called again gets an input of the type it was first called with;
- a constant broadcasts against the value (per channel, per last dim, over the batch...), and
  an in-place op never gets a constant that would promote or widen its target.

Tensor values (weights, BatchNorm statistics, constants, the input) come from ``ModelSpec.seed``
when the model is built, not from the draw.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from hypothesis import strategies as st

from tests.fuzz.build import constant_shape
from tests.fuzz.draw_idioms import (
    draw_branch,
    draw_cache,
    draw_counter,
    draw_decorations,
    draw_model_idioms,
    draw_probe,
    draw_random,
    draw_view_write,
)
from tests.fuzz.spec import (
    CHANNEL_CAP,
    DROPOUT_FUNCTIONS,
    DROPOUT_MODULES,
    FLATTEN_CAP,
    HOOKABLE,
    INPUT_SPATIAL,
    MAX_BLOCKS,
    PRODUCERS,
    SHAREABLE,
    SPATIAL_CAP,
    Block,
    Kind,
    Layout,
    ModelSpec,
    Value,
)

Draw = Callable[[st.SearchStrategy[Any]], Any]
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
STORAGES = ("parameter", "buffer")


@dataclass(frozen=True)
class DimConv:
    """One spatial dim of a conv: its hyper-parameters and the output size they give."""

    stride: int
    dilation: int
    kernel: int
    padding: int
    output_padding: int
    out: int


def conv_dim_options(size: int, transposed: bool, padding_mode: str, cap: int) -> list[DimConv]:
    """Every (stride, dilation, kernel, padding[, output_padding]) valid for an input ``size``,
    simplest first; the output is 1..``cap``."""
    options = []
    for stride in (1, 2):
        for dilation in (1, 2):
            for kernel in (1, 2, 3):
                span = dilation * (kernel - 1) + 1  # the dilated kernel's extent
                for padding in (0, 1, 2):
                    if transposed:
                        # out = (size - 1) * stride - 2 * padding + span + output_padding
                        for out_pad in range(max(stride, dilation)):
                            out = (size - 1) * stride - 2 * padding + span + out_pad
                            if 1 <= out <= cap:
                                options.append(
                                    DimConv(stride, dilation, kernel, padding, out_pad, out)
                                )
                        continue
                    if (padding_mode == "reflect" and padding >= size) or (
                        padding_mode == "circular" and padding > size
                    ):
                        continue
                    if span > size + 2 * padding:
                        continue
                    out = (size + 2 * padding - span) // stride + 1
                    if out <= cap:
                        options.append(DimConv(stride, dilation, kernel, padding, 0, out))
    return options


def _same_fits(o: DimConv, size: int, padding_mode: str) -> bool:
    """padding="same" pads ``span - 1`` in total, the larger half after the input."""
    after = o.dilation * (o.kernel - 1) - o.dilation * (o.kernel - 1) // 2
    if padding_mode == "reflect":
        return after < size
    if padding_mode == "circular":  # wraps around at most once
        return after <= size
    return True


def _divisors(n: int) -> list[int]:
    return [g for g in range(1, n + 1) if n % g == 0]


def _latest_first(values: list[int]) -> st.SearchStrategy[int]:
    """One of ``values``, shrinking towards the last (the most recent value)."""
    return st.sampled_from(values[::-1])


def _draw_conv(draw: Draw, x: Value, transposed: bool) -> tuple[str, dict[str, Any], Value]:
    groups = draw(st.sampled_from(_divisors(x.channels)))
    per_group = draw(st.integers(1, min(max(2, 8 // groups), CHANNEL_CAP // groups)))
    form = draw(st.sampled_from(("module", "function")))
    padding_mode, style = "zeros", "int"
    if not transposed:
        padding_mode = draw(st.sampled_from(PADDING_MODES))
        if form == "module" or padding_mode == "zeros":
            style = draw(st.sampled_from(("int", "same", "valid")))
    dims = []
    for size in x.spatial:
        options = conv_dim_options(size, transposed, padding_mode, SPATIAL_CAP[x.dims])
        if style == "same":  # stride 1, any kernel the padding mode allows: out = size
            options = [
                DimConv(1, dilation, kernel, 0, 0, size)
                for dilation in (1, 2)
                for kernel in (1, 2, 3)
                if _same_fits(DimConv(1, dilation, kernel, 0, 0, size), size, padding_mode)
            ]
        elif style == "valid":
            options = [o for o in options if o.padding == 0]
        dims.append(draw(st.sampled_from(options)))
    opts: dict[str, Any] = {
        "out_channels": groups * per_group,
        "kernel": tuple(o.kernel for o in dims),
        "stride": tuple(o.stride for o in dims),
        "padding": style if style != "int" else tuple(o.padding for o in dims),
        "dilation": tuple(o.dilation for o in dims),
        "groups": groups,
        "bias": draw(st.booleans()),
    }
    if transposed:
        opts["output_padding"] = tuple(o.output_padding for o in dims)
    else:
        opts["padding_mode"] = padding_mode
    if form == "function":
        opts["storage"] = draw(st.sampled_from(STORAGES))
    return form, opts, Value(groups * per_group, tuple(o.out for o in dims), x.dtype)


def _draw_linear(draw: Draw, x: Value) -> tuple[str, dict[str, Any], Value]:
    # on a spatial value it sets the last dim: keep that within the rank's cap
    out = draw(st.integers(1, min(8, SPATIAL_CAP[x.dims]) if x.dims else 8))
    form = draw(st.sampled_from(("module", "function")))
    opts: dict[str, Any] = {"out_features": out, "bias": draw(st.booleans())}
    if form == "function":
        opts["storage"] = draw(st.sampled_from(STORAGES))
    if x.dims == 0:
        return form, opts, Value(out, (), x.dtype)
    return form, opts, Value(x.channels, (*x.spatial[:-1], out), x.dtype)  # acts on the last dim


EPS = st.integers(-50, -10).map(lambda e: float(f"{10 ** (e / 10):.2g}"))  # 1e-5 .. 0.1


def _draw_batchnorm(draw: Draw, x: Value, batch: int) -> tuple[str, dict[str, Any], Value]:
    # batch statistics need more than one value per channel
    batch_stats_ok = batch * math.prod(x.spatial) > 1
    forms = ["module", "module", "function", "function_kwargs"]
    forms += ["function_batch_stats"] if batch_stats_ok else []
    form = draw(st.sampled_from(forms))
    opts: dict[str, Any] = {"eps": draw(EPS)}
    if form == "module":
        opts["affine"] = draw(st.booleans())
        # one BN module in four normalizes by batch statistics (it must be left alone)
        track = st.sampled_from((True, True, True, False)) if batch_stats_ok else st.just(True)
        opts["track_running_stats"] = draw(track)
    else:
        opts["affine"] = draw(st.sampled_from((*STORAGES, "none")))
    return form, opts, x


_ACTIVATION_FORMS = {
    "relu": ("module", "function", "torch", "method"),
    "relu6": ("module", "function"),
    "hardtanh": ("module", "function"),
    "hardswish": ("module", "function"),
    "clamp": ("torch", "method"),
}
# bounds in hundredths: min anywhere in [-3, 3] (so min > 0 and max < 0 both happen)
_BOUND = st.integers(-300, 300).map(lambda v: v / 100)
_WIDTH = st.integers(5, 400).map(lambda v: v / 100)


def _draw_activation(draw: Draw, x: Value) -> tuple[str, dict[str, Any], Value]:
    op = draw(st.sampled_from(tuple(_ACTIVATION_FORMS)))
    form = draw(st.sampled_from(_ACTIVATION_FORMS[op]))
    opts: dict[str, Any] = {"op": op, "inplace": draw(st.booleans())}
    if op in ("hardtanh", "clamp"):
        lo = draw(_BOUND)
        hi = round(lo + draw(_WIDTH), 2)
        which = draw(st.sampled_from(("both", "min", "max"))) if op == "clamp" else "both"
        opts["min"] = None if which == "max" else lo
        opts["max"] = None if which == "min" else hi
    return form, opts, x


def _draw_dropout(draw: Draw, x: Value) -> tuple[str, dict[str, Any], Value]:
    kinds = [k for k, (_, dims) in DROPOUT_MODULES.items() if x.dims in dims]
    kinds += [k for k, dims in DROPOUT_FUNCTIONS.items() if x.dims in dims]
    fn = draw(st.sampled_from(kinds))
    form = "module" if fn in DROPOUT_MODULES else "function"
    opts: dict[str, Any] = {"fn": fn, "p": draw(st.integers(0, 9)) / 10}
    if form == "module" or fn == "F.dropout(training=False)":
        opts["inplace"] = draw(st.booleans())
    return form, opts, x


_SCALARS = {
    "add": (1, 0, 2, -1.5, 0.5, 3),
    "sub": (1, 0, 2, -1.5, 0.5, 3),
    "mul": (2, 1, 0, -1, 0.5, 1.5),
    "div": (2, 1, -1, 0.5, 4, 3),
}
_CONSTANTS = ("scalar", "0-dim", "one", "channel", "channel_batched", "last", "full", "batch")


def _draw_arithmetic(
    draw: Draw, x: Value, batch: int, last: bool
) -> tuple[str, dict[str, Any], Value]:
    op = draw(st.sampled_from(("add", "sub", "mul", "div")))
    const = draw(st.sampled_from((*_CONSTANTS, "wider") if last else _CONSTANTS))
    forms = ["operator", "torch", "method"]
    forms += ["reversed"] if op != "div" else []  # c / x: x may be 0
    forms += ["inplace"] if const != "wider" else []  # x.add_(c) cannot grow x
    form = draw(st.sampled_from(forms))
    opts: dict[str, Any] = {"op": op, "const": const}
    if form == "torch" and op in ("add", "sub"):
        opts["alpha"] = draw(st.sampled_from((1, 2, -0.5)))
    if const == "scalar":
        opts["value"] = draw(st.sampled_from(_SCALARS[op]))
        return form, opts, x
    rank = x.dims + 2
    shape = constant_shape(const, x, batch)
    dtypes = ["model", "float64", "int64"]
    if form == "inplace" and len(shape) and x.dtype != torch.float64:
        dtypes.remove("float64")  # x.add_(c) cannot promote x
    opts["dtype"] = draw(st.sampled_from(dtypes))
    opts["batch"] = batch
    cdtype = {"model": x.dtype, "float64": torch.float64, "int64": torch.int64}[opts["dtype"]]
    storages = (
        ("buffer", "attribute") if cdtype is torch.int64 else ("buffer", "parameter", "attribute")
    )
    opts["storage"] = draw(st.sampled_from(storages))
    opts["computed"] = draw(st.booleans())
    dtype = torch.result_type(
        torch.zeros((1,) * rank, dtype=x.dtype), torch.zeros(shape, dtype=cdtype)
    )
    return form, opts, Value(x.channels, x.spatial, dtype, extra_dim=const == "wider")


_BINARY_FORMS = {
    "add": ("operator", "reversed", "torch", "inplace"),
    "sub": ("operator", "reversed", "inplace"),
    "mul": ("operator", "inplace"),
    "cat": ("list", "tuple"),
}


def _draw_binary(
    draw: Draw, x: Value, values: list[Value]
) -> tuple[str, dict[str, Any], Value, int]:
    same = [j for j, v in enumerate(values) if v == x]  # x itself included: x + x
    cat = [
        j
        for j, v in enumerate(values)
        if v.spatial == x.spatial and v.dtype == x.dtype and not v.extra_dim
        and x.channels + v.channels <= CHANNEL_CAP
    ]  # fmt: skip
    op = draw(st.sampled_from(("add", "sub", "mul", "cat") if cat else ("add", "sub", "mul")))
    form = draw(st.sampled_from(_BINARY_FORMS[op]))
    other = draw(_latest_first(cat if op == "cat" else same))
    out = x if op != "cat" else replace(x, channels=x.channels + values[other].channels)
    return form, {"op": op}, out, other


def _kinds(
    x: Value, src_kind: Kind | None, can_again: bool, caches: bool, counters: bool
) -> list[Kind | None]:
    """The kinds a block may take after a value of type ``x``, repeated to weight them;
    None stands for calling an earlier module again."""
    weights = {
        Kind.ACTIVATION: 2,
        Kind.BATCHNORM: 12 if src_kind in PRODUCERS else 3,  # conv -> BN: the fold to test
        Kind.ARITHMETIC: 5 if src_kind in PRODUCERS else 2,
        Kind.LINEAR: 1,
        Kind.DROPOUT: 1,
        Kind.BINARY: 1,
        Kind.VIEW_WRITE: 2,
        Kind.CACHE: 1 if caches else 0,  # one model in four: LeViT's and cold ones are refused
        Kind.BRANCH: 1,
        Kind.RANDOM: 0 if x.extra_dim else 1,
        Kind.COUNTER: 1 if counters else 0,  # one model in eight: the FX stages refuse them
    }
    if x.dims:
        weights[Kind.CONV] = 3
        weights[Kind.CONV_TRANSPOSE] = 2
        weights[Kind.FLATTEN] = 1 if x.channels * math.prod(x.spatial) <= FLATTEN_CAP else 0
    # not after a flatten (too many channels), nor past the next rank's spatial cap
    if (
        x.dims < 3
        and x.channels <= CHANNEL_CAP
        and max(x.spatial, default=1) <= SPATIAL_CAP[x.dims + 1]
    ):
        weights[Kind.UNSQUEEZE] = 1
    kinds: list[Kind | None] = [k for k in Kind for _ in range(weights.get(k, 0))]
    return [*kinds, None, None] if can_again else kinds


def _draw_block(
    draw: Draw,
    blocks: list[Block],
    values: list[Value],
    batch: int,
    last: bool,
    allowed: tuple[bool, bool],
) -> Block:
    """The next block; ``allowed``: whether caches, and call counters, may be drawn."""
    # mostly the latest value (a chain); one time in four any value (several consumers)
    latest = len(values) - 1
    chain = draw(st.sampled_from((True, True, True, False)))
    src = latest if chain else draw(_latest_first(list(range(len(values)))))
    x = values[src]
    src_kind = blocks[src - 1].kind if src else None
    again = [
        j for j, b in enumerate(blocks)
        if b.owner is None and b.kind in SHAREABLE and values[b.src] == x
    ]  # fmt: skip
    kind = draw(st.sampled_from(_kinds(x, src_kind, bool(again), *allowed)))
    if kind is None:  # the same module (or the same weights) called again
        j = draw(_latest_first(again))
        options = {**blocks[j].options, "alias": draw(st.booleans())}
        return replace(blocks[j], src=src, owner=j, options=options)
    other = None
    if kind in (Kind.CONV, Kind.CONV_TRANSPOSE):
        form, opts, out = _draw_conv(draw, x, kind is Kind.CONV_TRANSPOSE)
    elif kind is Kind.LINEAR:
        form, opts, out = _draw_linear(draw, x)
    elif kind is Kind.BATCHNORM:
        form, opts, out = _draw_batchnorm(draw, x, batch)
    elif kind is Kind.ACTIVATION:
        form, opts, out = _draw_activation(draw, x)
    elif kind is Kind.DROPOUT:
        form, opts, out = _draw_dropout(draw, x)
    elif kind is Kind.ARITHMETIC:
        form, opts, out = _draw_arithmetic(draw, x, batch, last)
    elif kind is Kind.BINARY:
        form, opts, out, other = _draw_binary(draw, x, values)
    elif kind is Kind.FLATTEN:
        form = draw(st.sampled_from(("torch", "method", "module", "reshape")))
        opts, out = {}, Value(x.channels * math.prod(x.spatial), (), x.dtype)
    elif kind is Kind.VIEW_WRITE:
        form, opts, out = draw_view_write(draw, x, batch)
    elif kind is Kind.CACHE:
        form, opts, out = draw_cache(draw, x)
    elif kind is Kind.BRANCH:
        form, opts, out = draw_branch(draw, x)
    elif kind is Kind.RANDOM:
        form, opts, out = draw_random(draw, x)
    elif kind is Kind.COUNTER:
        form, opts, out = draw_counter(draw, x)
    else:
        form = draw(st.sampled_from(("method", "torch")))
        opts, out = {}, Value(x.channels, (*x.spatial, 1), x.dtype)
    if kind in HOOKABLE and form == "module":
        opts |= draw_decorations(draw, kind, x, opts)
    return Block(kind, form, src, out, opts, other)


_LAYOUTS = {
    0: (Layout.CONTIGUOUS, Layout.CONTIGUOUS, Layout.STRIDED),
    1: (Layout.CONTIGUOUS, Layout.CONTIGUOUS, Layout.STRIDED),
    2: (
        Layout.CONTIGUOUS,
        Layout.CHANNELS_LAST,
        Layout.CONTIGUOUS,
        Layout.CHANNELS_LAST,
        Layout.STRIDED,
    ),
    3: (
        Layout.CONTIGUOUS,
        Layout.CHANNELS_LAST,
        Layout.CONTIGUOUS,
        Layout.CHANNELS_LAST,
        Layout.STRIDED,
    ),
}


@st.composite
def model_specs(draw: Draw, max_blocks: int = MAX_BLOCKS) -> ModelSpec:
    """Valid models of 1..``max_blocks`` blocks; two in three are float32, one in six float64,
    one in twelve float16 and one in twelve bfloat16."""
    dtype = draw(st.sampled_from((*(torch.float32,) * 8, torch.float64, torch.float64,
                                  torch.float16, torch.bfloat16)))  # fmt: skip
    dims = draw(st.sampled_from((2, 1, 3, 0, 2, 1, 3, 2)))  # 2-D most, like real models
    channels = draw(st.integers(1, 8))
    spatial = tuple(draw(st.integers(*INPUT_SPATIAL[dims])) for _ in range(dims))
    batch = draw(st.integers(1, 2))
    layout = draw(st.sampled_from(_LAYOUTS[dims]))
    n = draw(st.integers(1, max_blocks))
    allowed = (draw(st.integers(0, 3)) == 3, draw(st.integers(0, 7)) == 7)  # caches, counters
    values = [Value(channels, spatial, dtype)]
    blocks: list[Block] = []
    for i in range(n):
        block = _draw_block(draw, blocks, values, batch, i == n - 1, allowed)
        blocks.append(block)
        values.append(block.out)
    outputs: tuple[int, ...] = (len(blocks),)
    if len(blocks) > 1 and draw(st.integers(0, 3)) == 3:  # also return an intermediate
        outputs += (draw(st.integers(1, len(blocks) - 1)),)
    seed = draw(st.integers(0, 2**16 - 1))
    idioms = draw_model_idioms(draw, blocks, outputs)
    probe = draw_probe(draw, dims)
    return ModelSpec(values[0], batch, layout, tuple(blocks), outputs, seed, **idioms, probe=probe)
