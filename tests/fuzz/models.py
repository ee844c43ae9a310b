"""Random eager models for differential fuzzing: hypothesis strategies that only draw valid ones.

A model is a *program*: a tuple of ``Block``s that ``FuzzModel.forward`` runs in order. Value 0
is the input; block ``i`` reads earlier values (``src``, and ``other`` for a binary op) and its
result is value ``i + 1``. ``model_specs()`` draws each block from the type of the value that
reaches it (channels, spatial sizes, dtype), so every model is valid by construction, nothing is
drawn and then filtered:

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

Tensor values (weights, BatchNorm statistics, constants, the input) come from ``ModelSpec.seed``,
so a spec rebuilds the same model every time. The spec prints as a readable program.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

CHANNEL_CAP = 16
SPATIAL_CAP = {1: 16, 2: 12, 3: 7}  # every value's spatial sizes stay within its rank's cap
INPUT_SPATIAL = {1: (3, 9), 2: (3, 9), 3: (3, 6)}
FLATTEN_CAP = 2048  # features a flatten may produce (the Linear after it stays small)
MAX_BLOCKS = 8


class Kind(enum.Enum):
    """What a block computes; the order is the order hypothesis shrinks towards."""

    ACTIVATION = "activation"
    CONV = "conv"
    BATCHNORM = "batchnorm"
    ARITHMETIC = "arithmetic"  # with a constant
    LINEAR = "linear"
    DROPOUT = "dropout"
    BINARY = "binary"  # with an earlier value: residual add, sub, mul, cat
    CONV_TRANSPOSE = "conv_transpose"
    FLATTEN = "flatten"
    UNSQUEEZE = "unsqueeze"


PRODUCERS = (Kind.CONV, Kind.CONV_TRANSPOSE, Kind.LINEAR)
SHAREABLE = (*PRODUCERS, Kind.BATCHNORM)


class Layout(enum.Enum):
    CONTIGUOUS = "contiguous"
    CHANNELS_LAST = "channels_last"  # channels_last for 4-D, channels_last_3d for 5-D
    STRIDED = "strided"  # a view of every other element of the last dim


@dataclass(frozen=True)
class Value:
    """The type of a value: ``[N, channels, *spatial]``, or ``[N, channels]`` with no spatial."""

    channels: int
    spatial: tuple[int, ...]
    dtype: torch.dtype
    extra_dim: bool = False  # a constant with more dims made it ``[1, N, C, *spatial]``

    @property
    def dims(self) -> int:
        return len(self.spatial)

    def shape(self, batch: int) -> tuple[int, ...]:
        lead = (1,) if self.extra_dim else ()
        return (*lead, batch, self.channels, *self.spatial)

    def __str__(self) -> str:
        lead = "1, " if self.extra_dim else ""
        dims = "".join(f", {s}" for s in self.spatial)
        return f"[{lead}N, {self.channels}{dims}] {str(self.dtype).removeprefix('torch.')}"


@dataclass(frozen=True)
class Block:
    """One step of the program. ``form`` says how it is written (module, function, method...);
    ``owner`` is the block whose module or tensors a repeated call reuses."""

    kind: Kind
    form: str
    src: int
    out: Value
    options: dict[str, Any] = field(default_factory=dict)
    other: int | None = None
    owner: int | None = None

    @property
    def inplace(self) -> bool:
        return bool(self.options.get("inplace")) or self.form == "inplace"

    def describe(self, index: int) -> str:
        args = f"v{self.src}" + (f", v{self.other}" if self.other is not None else "")
        shared = f" calls block {self.owner}'s" if self.owner is not None else ""
        opts = " ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"v{index + 1} = {self.kind.value}[{self.form}{shared}]({args}) {opts} -> {self.out}"


@dataclass(frozen=True)
class ModelSpec:
    """A whole model: the input, the program, which values it returns, and the value seed."""

    input: Value
    batch: int
    layout: Layout
    blocks: tuple[Block, ...]
    outputs: tuple[int, ...]
    seed: int

    def values(self) -> list[Value]:
        return [self.input, *(b.out for b in self.blocks)]

    def references(self) -> list[int]:
        """How many times each value is read (by blocks and as an output)."""
        refs = [0] * (len(self.blocks) + 1)
        for b in self.blocks:
            refs[b.src] += 1
            if b.other is not None:
                refs[b.other] += 1
        for k in self.outputs:
            refs[k] += 1
        return refs

    def __repr__(self) -> str:
        lines = [
            f"ModelSpec(input={self.input.__str__().replace('N', str(self.batch), 1)} "
            f"{self.layout.value}, seed={self.seed}):"
        ]
        lines += [f"    {b.describe(i)}" for i, b in enumerate(self.blocks)]
        lines.append("    return " + ", ".join(f"v{k}" for k in self.outputs))
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints failing examples with this: the program, not the dataclass."""
        printer.text(repr(self))


# ----------------------------------------------------------------------------- building


def attr_base(index: int, block: Block) -> str:
    """The attribute prefix of the module or tensors ``block`` (number ``index``) uses."""
    base = f"b{block.owner if block.owner is not None else index}"
    return base + "_alias" if block.options.get("alias") else base


def example_input(spec: ModelSpec) -> torch.Tensor:
    gen = torch.Generator().manual_seed(spec.seed)
    shape = spec.input.shape(spec.batch)
    if spec.layout is Layout.STRIDED:
        wide = torch.randn(*shape[:-1], 2 * shape[-1], generator=gen, dtype=spec.input.dtype)
        return wide[..., ::2]
    x = torch.randn(*shape, generator=gen, dtype=spec.input.dtype)
    if spec.layout is Layout.CHANNELS_LAST:
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        x = x.contiguous(memory_format=fmt)
    return x


class FuzzModel(nn.Module):
    """An eager model that runs ``spec``'s program; deep-copyable, picklable, fx-traceable."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        values = spec.values()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            for i, block in enumerate(spec.blocks):
                if block.owner is None:
                    _BUILDERS[block.kind](self, f"b{i}", block, values[block.src])
                elif block.options.get("alias"):
                    _alias(self, f"b{block.owner}")
        self.eval()

    def forward(self, x: torch.Tensor) -> Any:
        values = [x]
        for i, block in enumerate(self.spec.blocks):
            values.append(_RUNNERS[block.kind](self, attr_base(i, block), block, values))
        outputs = tuple(values[k] for k in self.spec.outputs)
        return outputs[0] if len(outputs) == 1 else outputs


def build(spec: ModelSpec) -> FuzzModel:
    return FuzzModel(spec)


def _alias(model: nn.Module, base: str) -> None:
    """Register ``base``'s module, or its tensors, a second time under ``<base>_alias``."""
    if hasattr(model, f"{base}_alias") or hasattr(model, f"{base}_alias_weight"):
        return
    if base in model._modules:
        model.add_module(f"{base}_alias", model._modules[base])
        return
    for suffix in ("weight", "bias", "mean", "var"):
        name = f"{base}_{suffix}"
        if name in model._parameters:
            model.register_parameter(f"{base}_alias_{suffix}", model._parameters[name])
        elif name in model._buffers:
            model.register_buffer(f"{base}_alias_{suffix}", model._buffers[name])


def _store(model: nn.Module, name: str, tensor: torch.Tensor, storage: str) -> None:
    if storage == "parameter":
        model.register_parameter(name, nn.Parameter(tensor))
    elif storage == "buffer":
        model.register_buffer(name, tensor)
    else:  # a plain tensor attribute: fx reads it through a get_attr all the same
        object.__setattr__(model, name, tensor)


def _conv_module(block: Block, x: Value) -> nn.Module:
    o, d = block.options, x.dims
    if block.kind is Kind.CONV:
        cls = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[d - 1]
        return cls(
            x.channels, o["out_channels"], o["kernel"], o["stride"], o["padding"],
            o["dilation"], o["groups"], o["bias"], o["padding_mode"], dtype=x.dtype,
        )  # fmt: skip
    cls_t = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)[d - 1]
    return cls_t(
        x.channels, o["out_channels"], o["kernel"], o["stride"], o["padding"],
        o["output_padding"], o["groups"], o["bias"], o["dilation"], dtype=x.dtype,
    )  # fmt: skip


def _build_layer(model: nn.Module, name: str, block: Block, x: Value) -> None:
    """Conv, transposed conv and linear: a module, or its weight and bias for ``F.*``."""
    if block.kind is Kind.LINEAR:
        layer: nn.Module = nn.Linear(
            x.spatial[-1] if x.dims else x.channels,
            block.options["out_features"],
            block.options["bias"],
            dtype=x.dtype,
        )
    else:
        layer = _conv_module(block, x)
    if block.form == "module":
        model.add_module(name, layer)
        return
    for suffix in ("weight", "bias"):
        tensor = getattr(layer, suffix)
        if tensor is not None:
            _store(model, f"{name}_{suffix}", tensor.detach().clone(), block.options["storage"])


def _batchnorm_stats(channels: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Running statistics and affine parameters far from the defaults (a folding bug shows)."""
    return {
        "mean": torch.randn(channels, dtype=dtype) * 2,
        "var": torch.rand(channels, dtype=dtype) * 3 + 0.05,
        "weight": torch.randn(channels, dtype=dtype),
        "bias": torch.randn(channels, dtype=dtype),
    }


def _build_batchnorm(model: nn.Module, name: str, block: Block, x: Value) -> None:
    o = block.options
    stats = _batchnorm_stats(x.channels, x.dtype)
    if block.form == "module":
        cls = {0: nn.BatchNorm1d, 1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[x.dims]
        bn = cls(
            x.channels, eps=o["eps"], affine=o["affine"],
            track_running_stats=o["track_running_stats"], dtype=x.dtype,
        )  # fmt: skip
        with torch.no_grad():
            if bn.running_mean is not None and bn.running_var is not None:
                bn.running_mean.copy_(stats["mean"])
                bn.running_var.copy_(stats["var"])
            if bn.weight is not None and bn.bias is not None:
                bn.weight.copy_(stats["weight"])
                bn.bias.copy_(stats["bias"])
        model.add_module(name, bn)
        return
    if block.form != "function_batch_stats":
        model.register_buffer(f"{name}_mean", stats["mean"])
        model.register_buffer(f"{name}_var", stats["var"])
    if o["affine"] != "none":
        _store(model, f"{name}_weight", stats["weight"], o["affine"])
        _store(model, f"{name}_bias", stats["bias"], o["affine"])


def _constant_shape(kind: str, x: Value, batch: int) -> tuple[int, ...]:
    ones = (1,) * x.dims
    last = x.spatial[-1] if x.dims else x.channels
    return {
        "0-dim": (),
        "one": (1,),
        "channel": (x.channels, *ones),
        "channel_batched": (1, x.channels, *ones),
        "last": (last,),
        "full": (x.channels, *x.spatial),
        "batch": (batch, 1, *ones),
        "wider": (1, 1, x.channels, *ones),
    }[kind]


def constant_dtype(block: Block, x: Value) -> torch.dtype:
    return {"model": x.dtype, "float64": torch.float64, "int64": torch.int64}[
        block.options["dtype"]
    ]


def _build_constant(model: nn.Module, name: str, block: Block, x: Value) -> None:
    o = block.options
    if o["const"] == "scalar":
        return
    shape = _constant_shape(o["const"], x, o["batch"])
    dtype = constant_dtype(block, x)
    sign = torch.randint(0, 2, shape) * 2 - 1
    if dtype is torch.int64:
        value = torch.randint(1, 4, shape) * sign
    elif o["op"] in ("mul", "div"):
        value = (torch.rand(shape, dtype=dtype) * 1.75 + 0.25) * sign  # |c| in [0.25, 2]
    else:
        value = torch.randn(shape, dtype=dtype)
    _store(model, f"{name}_const", value, o["storage"])


def _build_module(model: nn.Module, name: str, block: Block, x: Value) -> None:
    """Activation, dropout and flatten blocks written as modules."""
    if block.form != "module":
        return
    o = block.options
    inplace = bool(o.get("inplace"))
    if block.kind is Kind.FLATTEN:
        module: nn.Module = nn.Flatten()
    elif block.kind is Kind.DROPOUT:
        module = DROPOUT_MODULES[o["fn"]][0](o["p"], inplace)
    elif o["op"] == "hardtanh":
        module = nn.Hardtanh(o["min"], o["max"], inplace)
    else:
        module = {"relu": nn.ReLU, "relu6": nn.ReLU6, "hardswish": nn.Hardswish}[o["op"]](inplace)
    model.add_module(name, module)


def _build_nothing(model: nn.Module, name: str, block: Block, x: Value) -> None:
    pass


_BUILDERS: dict[Kind, Callable[[nn.Module, str, Block, Value], None]] = {
    Kind.ACTIVATION: _build_module,
    Kind.DROPOUT: _build_module,
    Kind.FLATTEN: _build_module,
    Kind.CONV: _build_layer,
    Kind.CONV_TRANSPOSE: _build_layer,
    Kind.LINEAR: _build_layer,
    Kind.BATCHNORM: _build_batchnorm,
    Kind.ARITHMETIC: _build_constant,
    Kind.BINARY: _build_nothing,
    Kind.UNSQUEEZE: _build_nothing,
}

# ----------------------------------------------------------------------------- running

Values = list[torch.Tensor]


def _run_activation(m: nn.Module, name: str, b: Block, values: Values) -> torch.Tensor:
    x, o = values[b.src], b.options
    op, inplace = o["op"], bool(o.get("inplace"))
    if b.form == "module":
        return getattr(m, name)(x)
    if op == "relu":
        if b.form == "function":
            return F.relu(x, inplace=inplace)
        if b.form == "torch":
            return torch.relu_(x) if inplace else torch.relu(x)
        return x.relu_() if inplace else x.relu()
    if op == "relu6":
        return F.relu6(x, inplace=inplace)
    if op == "hardswish":
        return F.hardswish(x, inplace=inplace)
    if op == "hardtanh":
        return F.hardtanh(x, o["min"], o["max"], inplace=inplace)
    lo, hi = o["min"], o["max"]  # clamp; one bound may be None
    if b.form == "torch":
        return torch.clamp_(x, lo, hi) if inplace else torch.clamp(x, lo, hi)
    return x.clamp_(min=lo, max=hi) if inplace else x.clamp(min=lo, max=hi)


# dropout module name -> (class, value ranks it may see: dims of the input)
DROPOUT_MODULES: dict[str, tuple[type[nn.Module], frozenset[int]]] = {
    "Dropout": (nn.Dropout, frozenset({0, 1, 2, 3})),
    "Dropout1d": (nn.Dropout1d, frozenset({1})),
    "Dropout2d": (nn.Dropout2d, frozenset({2})),
    "Dropout3d": (nn.Dropout3d, frozenset({3})),
    "AlphaDropout": (nn.AlphaDropout, frozenset({0, 1, 2, 3})),
    "FeatureAlphaDropout": (nn.FeatureAlphaDropout, frozenset({1, 2, 3})),
}
# functional dropout -> the dims it may see. "F.dropout(p=0)" keeps the default training=True,
# so it really drops in eval mode: p is 0 so that eager stays deterministic.
DROPOUT_FUNCTIONS: dict[str, frozenset[int]] = {
    "F.dropout(training=False)": frozenset({0, 1, 2, 3}),
    "F.dropout(self.training)": frozenset({0, 1, 2, 3}),
    "F.dropout(p=0)": frozenset({0, 1, 2, 3}),
    "F.dropout1d(training=False)": frozenset({1}),
    "F.dropout2d(training=False)": frozenset({2}),
    "F.dropout3d(training=False)": frozenset({3}),
    "F.alpha_dropout": frozenset({0, 1, 2, 3}),
    "F.feature_alpha_dropout": frozenset({1, 2, 3}),
    "torch.dropout(train=False)": frozenset({0, 1, 2, 3}),
    "torch.feature_dropout(train=False)": frozenset({1, 2, 3}),
}


def _run_dropout(m: nn.Module, name: str, b: Block, values: Values) -> torch.Tensor:
    x, fn, p = values[b.src], b.options["fn"], b.options["p"]
    inplace = bool(b.options.get("inplace"))
    if b.form == "module":
        return getattr(m, name)(x)
    if fn == "F.dropout(training=False)":
        return F.dropout(x, p, training=False, inplace=inplace)
    if fn == "F.dropout(self.training)":
        return F.dropout(x, p, m.training)
    if fn == "F.dropout(p=0)":
        return F.dropout(x, 0.0)
    if fn == "F.dropout1d(training=False)":
        return F.dropout1d(x, p, training=False)
    if fn == "F.dropout2d(training=False)":
        return F.dropout2d(x, p, training=False)
    if fn == "F.dropout3d(training=False)":
        return F.dropout3d(x, p, training=False)
    if fn == "F.alpha_dropout":
        return F.alpha_dropout(x, p)  # training defaults to False
    if fn == "F.feature_alpha_dropout":
        return F.feature_alpha_dropout(x, p)
    if fn == "torch.dropout(train=False)":
        return torch.dropout(x, p, False)
    return torch.feature_dropout(x, p, False)


def _reversed_padding(padding: tuple[int, ...]) -> list[int]:
    """``F.pad``'s argument for symmetric ``padding`` per spatial dim (last dim first)."""
    return [p for size in reversed(padding) for p in (size, size)]


_CONV_FUNCTIONS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T_FUNCTIONS = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _run_layer(m: nn.Module, name: str, b: Block, values: Values) -> torch.Tensor:
    x, o = values[b.src], b.options
    if b.form == "module":
        return getattr(m, name)(x)
    weight = getattr(m, f"{name}_weight")
    bias = getattr(m, f"{name}_bias") if o["bias"] else None
    if b.kind is Kind.LINEAR:
        return F.linear(x, weight, bias)
    dims = len(o["kernel"])
    if b.kind is Kind.CONV_TRANSPOSE:
        return _CONV_T_FUNCTIONS[dims](
            x, weight, bias, o["stride"], o["padding"], o["output_padding"], o["groups"],
            o["dilation"],
        )  # fmt: skip
    padding = o["padding"]
    if o["padding_mode"] != "zeros":  # what nn.Conv does: pad, then convolve unpadded
        x = F.pad(x, _reversed_padding(padding), mode=o["padding_mode"])
        padding = 0
    return _CONV_FUNCTIONS[dims](x, weight, bias, o["stride"], padding, o["dilation"], o["groups"])


def _run_batchnorm(m: nn.Module, name: str, b: Block, values: Values) -> torch.Tensor:
    x, o = values[b.src], b.options
    if b.form == "module":
        return getattr(m, name)(x)
    affine = o["affine"] != "none"
    weight = getattr(m, f"{name}_weight") if affine else None
    bias = getattr(m, f"{name}_bias") if affine else None
    if b.form == "function_batch_stats":  # no running stats: normalizes by the batch's
        return F.batch_norm(x, None, None, weight, bias, True, 0.1, o["eps"])
    mean, var = getattr(m, f"{name}_mean"), getattr(m, f"{name}_var")
    if b.form == "function_kwargs":
        return F.batch_norm(
            x, mean, var, weight=weight, bias=bias, training=m.training, eps=o["eps"]
        )
    return F.batch_norm(x, mean, var, weight, bias, False, 0.1, o["eps"])


def _run_arithmetic(m: nn.Module, name: str, b: Block, values: Values) -> torch.Tensor:
    x, o = values[b.src], b.options
    c: Any = o.get("value") if o["const"] == "scalar" else getattr(m, f"{name}_const")
    if o.get("computed"):
        c = c * 2  # a constant subgraph (for constant folding)
    op = o["op"]
    if b.form == "operator":
        return _operator(op, x, c)
    if b.form == "reversed":
        return c + x if op == "add" else (c - x if op == "sub" else c * x)
    if b.form == "torch":
        if op in ("add", "sub"):
            fn = torch.add if op == "add" else torch.sub
            return fn(x, c, alpha=o["alpha"])
        return torch.mul(x, c) if op == "mul" else torch.div(x, c)
    if b.form == "method":
        return getattr(x, op)(c)
    return getattr(x, op + "_")(c)


def _operator(op: str, x: Any, c: Any) -> Any:
    if op == "add":
        return x + c
    if op == "sub":
        return x - c
    if op == "mul":
        return x * c
    return x / c


def _run_binary(m: nn.Module, name: str, b: Block, values: Values) -> torch.Tensor:
    assert b.other is not None
    x, y, op = values[b.src], values[b.other], b.options["op"]
    if op == "cat":
        return torch.cat([x, y], dim=1) if b.form == "list" else torch.cat((x, y), 1)
    if b.form == "inplace":
        return getattr(x, op + "_")(y)
    if b.form == "reversed":
        return _operator(op, y, x)
    if b.form == "torch":
        return torch.add(x, y)
    return _operator(op, x, y)


def _run_flatten(m: nn.Module, name: str, b: Block, values: Values) -> torch.Tensor:
    x = values[b.src]
    if b.form == "module":
        return getattr(m, name)(x)
    if b.form == "torch":
        return torch.flatten(x, 1)
    if b.form == "method":
        return x.flatten(1)
    return x.reshape(x.shape[0], -1)


def _run_unsqueeze(m: nn.Module, name: str, b: Block, values: Values) -> torch.Tensor:
    x = values[b.src]
    return x.unsqueeze(-1) if b.form == "method" else torch.unsqueeze(x, -1)


_RUNNERS: dict[Kind, Callable[[nn.Module, str, Block, Values], torch.Tensor]] = {
    Kind.ACTIVATION: _run_activation,
    Kind.DROPOUT: _run_dropout,
    Kind.CONV: _run_layer,
    Kind.CONV_TRANSPOSE: _run_layer,
    Kind.LINEAR: _run_layer,
    Kind.BATCHNORM: _run_batchnorm,
    Kind.ARITHMETIC: _run_arithmetic,
    Kind.BINARY: _run_binary,
    Kind.FLATTEN: _run_flatten,
    Kind.UNSQUEEZE: _run_unsqueeze,
}


# ----------------------------------------------------------------------------- strategies

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
    shape = _constant_shape(const, x, batch)
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


def _kinds(x: Value, src_kind: Kind | None, can_again: bool) -> list[Kind | None]:
    """The kinds a block may take after a value of type ``x``, repeated to weight them;
    None stands for calling an earlier module again."""
    weights = {
        Kind.ACTIVATION: 2,
        Kind.BATCHNORM: 12 if src_kind in PRODUCERS else 3,  # conv -> BN: the fold to test
        Kind.ARITHMETIC: 5 if src_kind in PRODUCERS else 2,
        Kind.LINEAR: 1,
        Kind.DROPOUT: 1,
        Kind.BINARY: 1,
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
    draw: Draw, blocks: list[Block], values: list[Value], batch: int, last: bool
) -> Block:
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
    kind = draw(st.sampled_from(_kinds(x, src_kind, bool(again))))
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
    else:
        form = draw(st.sampled_from(("method", "torch")))
        opts, out = {}, Value(x.channels, (*x.spatial, 1), x.dtype)
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
    """Valid models of 1..``max_blocks`` blocks; one in four is float64."""
    dtype = draw(st.sampled_from((torch.float32, torch.float32, torch.float32, torch.float64)))
    dims = draw(st.sampled_from((2, 1, 3, 0, 2, 1, 3, 2)))  # 2-D most, like real models
    channels = draw(st.integers(1, 8))
    spatial = tuple(draw(st.integers(*INPUT_SPATIAL[dims])) for _ in range(dims))
    batch = draw(st.integers(1, 2))
    layout = draw(st.sampled_from(_LAYOUTS[dims]))
    n = draw(st.integers(1, max_blocks))
    values = [Value(channels, spatial, dtype)]
    blocks: list[Block] = []
    for i in range(n):
        block = _draw_block(draw, blocks, values, batch, last=i == n - 1)
        blocks.append(block)
        values.append(block.out)
    outputs: tuple[int, ...] = (len(blocks),)
    if len(blocks) > 1 and draw(st.integers(0, 3)) == 3:  # also return an intermediate
        outputs += (draw(st.integers(1, len(blocks) - 1)),)
    seed = draw(st.integers(0, 2**16 - 1))
    return ModelSpec(values[0], batch, layout, tuple(blocks), outputs, seed)
