"""Building and running a drawn program: ``FuzzModel``, an eager model that runs a ``ModelSpec``.

Every block kind has a builder (which registers its module, or its tensors for the functional
forms, on the model) and a runner (what ``forward`` does for it). The model is deep-copyable,
picklable and fx-traceable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from tests.fuzz.dynamic import Branch, CallCounter, branch, run_random
from tests.fuzz.hooks import register_hooks
from tests.fuzz.layers import CachedBias, CachedScale, parametrize_layer, subclassed
from tests.fuzz.outputs import pack
from tests.fuzz.spec import DROPOUT_MODULES, Block, Kind, ModelSpec, Value, attr_base
from tests.fuzz.views import run_view_write


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
        register_hooks(self, spec.root_hooks)
        self.eval()

    def forward(self, x: torch.Tensor) -> Any:
        return pack(self.spec.output_type, self.outputs(x))

    def outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [x]
        for i, block in enumerate(self.spec.blocks):
            values.append(_RUNNERS[block.kind](self, attr_base(i, block), block, values))
        return tuple(values[k] for k in self.spec.outputs)


class FuzzModelWithOptional(FuzzModel):
    """A ``FuzzModel`` whose forward also takes an optional bias for its first output, left at
    None by the fuzzer (``ModelSpec.optional_input``)."""

    def forward(
        self,
        x: torch.Tensor,
        bias: Optional[torch.Tensor] = None,  # noqa: UP045  (TorchScript's spelling)
    ) -> Any:
        outputs = self.outputs(x)
        if bias is not None:
            outputs = (outputs[0] + bias, *outputs[1:])
        return pack(self.spec.output_type, outputs)


def build(spec: ModelSpec) -> FuzzModel:
    return FuzzModelWithOptional(spec) if spec.optional_input else FuzzModel(spec)


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
        _add_module(model, name, block, layer)
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
        _add_module(model, name, block, bn)
        return
    if block.form != "function_batch_stats":
        model.register_buffer(f"{name}_mean", stats["mean"])
        model.register_buffer(f"{name}_var", stats["var"])
    if o["affine"] != "none":
        _store(model, f"{name}_weight", stats["weight"], o["affine"])
        _store(model, f"{name}_bias", stats["bias"], o["affine"])


def constant_shape(kind: str, x: Value, batch: int) -> tuple[int, ...]:
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
    shape = constant_shape(o["const"], x, o["batch"])
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
    _add_module(model, name, block, module)


def _build_nothing(model: nn.Module, name: str, block: Block, x: Value) -> None:
    pass


def _add_module(model: nn.Module, name: str, block: Block, module: nn.Module) -> None:
    """Register ``module`` as the block's, as the user wrote it: a subclass of its class that
    overrides ``forward``, parametrized weights, hooks (``block.options``)."""
    o = block.options
    if o.get("subclass"):
        subclassed(module, o["subclass"], o["gain"])
    parametrize_layer(module, tuple(o.get("parametrize", ())))
    register_hooks(module, block.hooks)
    model.add_module(name, module)


def _build_cache(model: nn.Module, name: str, block: Block, x: Value) -> None:
    if block.options["pattern"] == "dict":
        shape = (x.channels, *(1,) * x.dims)
        model.add_module(name, CachedScale(shape, block.options["op"], x.dtype))
    else:
        model.add_module(name, CachedBias(x.channels, x.spatial, x.dtype))


def _build_branch(model: nn.Module, name: str, block: Block, x: Value) -> None:
    if block.form == "module":
        model.add_module(name, Branch(block.options["on"], block.options["value"]))


def _build_counter(model: nn.Module, name: str, block: Block, x: Value) -> None:
    model.add_module(name, CallCounter(x.dtype, block.options["gain"]))


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
    Kind.VIEW_WRITE: _build_nothing,
    Kind.CACHE: _build_cache,
    Kind.BRANCH: _build_branch,
    Kind.RANDOM: _build_nothing,
    Kind.COUNTER: _build_counter,
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


def _run_branch(m: nn.Module, name: str, b: Block, values: Values) -> torch.Tensor:
    x = values[b.src]
    if b.form == "module":
        return getattr(m, name)(x)
    return branch(b.options["on"], x, b.options["value"])  # in the model's own forward


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
    Kind.VIEW_WRITE: lambda m, name, b, values: run_view_write(values[b.src], b.options),
    Kind.CACHE: lambda m, name, b, values: getattr(m, name)(values[b.src]),
    Kind.BRANCH: _run_branch,
    Kind.RANDOM: lambda m, name, b, values: run_random(values[b.src], b),
    Kind.COUNTER: lambda m, name, b, values: getattr(m, name)(values[b.src]),
}
