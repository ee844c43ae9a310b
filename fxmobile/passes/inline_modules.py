"""Inline the calls to standard leaf modules before scripting, so TorchScript compiles one method.

The last FX pass of ``fxmobile.optimize`` (not of ``optimize_fx``, whose graph module keeps the
model's submodules); blocklist ``MobileOptimizerType.INLINE_MODULES`` to keep the calls.

``self.conv(x)`` on an ``nn.Conv2d`` -> ``F.conv2d(x, self.conv_weight, self.conv_bias,
stride, padding, dilation, groups)``, with the tensors moved to the root module. Each rewrite
is the module's own ``forward`` written out down to the op it ends in, with the module's
hyperparameters as constants (``nn.ReLU(inplace=True)`` -> ``torch.relu_``: the branch the
functional form would take, so the graph before freezing has no untaken one), so the scripted
graph computes exactly what the module call did, and after freezing it is the same graph. The
functional calls users write that end in one ATen op once their arguments are filled in
(``F.adaptive_avg_pool2d(x, 1)`` -> ``aten::adaptive_avg_pool2d(x, [1, 1])``) become that op
too, so the frozen graph keeps no argument arithmetic; so do quantized convolutions, whose
forward checks the input's rank in Python before its ``quantized::`` op.

Why: ``torch.jit.script`` compiles a ScriptModule type, and runs ``forward``'s frontend, for
every submodule, and ``torch.jit.freeze`` then inlines them all again. On resnet50 that is
two thirds of scripting and freezing (0.33 s against 0.12 s with the calls inlined, one
thread). Only the exact types below are inlined (a subclass may override ``forward``), and
only without hooks or an instance-level ``forward``; a conv with a padding mode other than
zeros, a transposed conv given ``output_size``, a pool that returns indices, BatchNorm (the
TorchScript stage folds it into its conv by module) and every other module stay calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq
import torch.nn.functional as F
from torch import fx, nn

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.graph_utils import attr_of, fresh_attr_name, module_of
from fxmobile.passes.matchers import why_customized
from fxmobile.passes.stage import FxContext, FxPass


@dataclass(frozen=True)
class Attr:
    """An argument that is one of the module's tensors (None stays None), moved to the root."""

    name: str


@dataclass(frozen=True)
class Call:
    """What a module call computes: ``fn(input, *args, **kwargs)``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


_CONV = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d, nn.Conv3d: F.conv3d}
_CONV_TRANSPOSE = {
    nn.ConvTranspose1d: F.conv_transpose1d,
    nn.ConvTranspose2d: F.conv_transpose2d,
    nn.ConvTranspose3d: F.conv_transpose3d,
}
# the ATen ops F.max_pool*d end in when no indices are asked for (stride is never None here:
# the modules default it to the kernel size)
_MAX_POOL = {
    nn.MaxPool1d: torch.max_pool1d,
    nn.MaxPool2d: torch.max_pool2d,
    nn.MaxPool3d: torch.max_pool3d,
}
_WEIGHT_BIAS = (Attr("weight"), Attr("bias"))


def _conv(m: Any) -> Call | None:
    if m.padding_mode != "zeros":  # forward pads with F.pad first
        return None
    return Call(_CONV[type(m)], (*_WEIGHT_BIAS, m.stride, m.padding, m.dilation, m.groups))


def _conv_transpose(m: Any) -> Call | None:
    if m.padding_mode != "zeros":
        return None
    args = (*_WEIGHT_BIAS, m.stride, m.padding, m.output_padding, m.groups, m.dilation)
    return Call(_CONV_TRANSPOSE[type(m)], args)


def _max_pool(m: Any) -> Call | None:
    if m.return_indices:
        return None
    return Call(_MAX_POOL[type(m)], (m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode))


def _avg_pool_2d(m: Any) -> Call:
    args = (m.kernel_size, m.stride, m.padding, m.ceil_mode)
    return Call(F.avg_pool2d, (*args, m.count_include_pad, m.divisor_override))


# The ATen ops F.adaptive_avg_pool{2,3}d end in once every output size is given. The Python
# functions first fill a None size from the input's (``_list_with_default``), which TorchScript
# keeps in the frozen graph: aten::size, len, gt and a prim::If on every call. A module with a
# None size stays a call: written out, ``(None, 3)`` is a tuple TorchScript cannot compile.
_ADAPTIVE_AVG_POOL = {
    nn.AdaptiveAvgPool2d: (torch._C._nn.adaptive_avg_pool2d, F.adaptive_avg_pool2d, 2),
    nn.AdaptiveAvgPool3d: (torch._C._nn.adaptive_avg_pool3d, F.adaptive_avg_pool3d, 3),
}


def _given_sizes(size: Any, dims: int) -> tuple[int, ...] | None:
    """``output_size`` as ``dims`` ints, or None when the function would fill some in from the
    input or raise (a None entry, the wrong length, a value computed in forward)."""
    sizes = (size,) * dims if isinstance(size, int) else size
    if not isinstance(sizes, tuple | list) or len(sizes) != dims:
        return None
    return tuple(sizes) if all(isinstance(s, int) for s in sizes) else None


def _adaptive_avg_pool(m: Any) -> Call | None:
    # None keeps the call: a size taken from the input's ((None, 3) has no TorchScript
    # literal), or sizes the module's forward rejects
    op, _, dims = _ADAPTIVE_AVG_POOL[type(m)]
    sizes = _given_sizes(m.output_size, dims)
    return None if sizes is None else Call(op, (sizes,))


# the functions the modules above call, as users also write them: function -> (op, dims)
_DIRECT_FUNCTIONS = {function: (op, dims) for op, function, dims in _ADAPTIVE_AVG_POOL.values()}


def _direct_call(node: fx.Node) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
    """``F.adaptive_avg_pool2d(x, 1)`` in the graph -> (the ATen op, its arguments), when
    every output size is a constant; None for any other node. torch.fx records these calls
    through ``__torch_function__``, which passes both arguments by position."""
    if node.op != "call_function" or node.target not in _DIRECT_FUNCTIONS:
        return None
    op, dims = _DIRECT_FUNCTIONS[node.target]
    if len(node.args) != 2 or node.kwargs:
        return None
    source, size = node.args
    sizes = _given_sizes(size, dims)
    return None if sizes is None else (op, (source, sizes))


# The functional activations branch on ``inplace`` (F.hardtanh also checks its bounds, which
# the module's constructor already did): the ATen op chosen here is what the branch runs, and
# the scripted graph holds no untaken branch before freezing.
_OUT_OF_PLACE_AND_IN_PLACE = {
    nn.ReLU: (torch.relu, torch.relu_),
    nn.ReLU6: (torch._C._nn.hardtanh, torch._C._nn.hardtanh_),  # a Hardtanh(0, 6)
    nn.Hardtanh: (torch._C._nn.hardtanh, torch._C._nn.hardtanh_),
    nn.Hardswish: (torch._C._nn.hardswish, torch._C._nn.hardswish_),
    nn.Hardsigmoid: (torch._C._nn.hardsigmoid, torch._C._nn.hardsigmoid_),
    nn.SiLU: (torch._C._nn.silu, torch._C._nn.silu_),
}


def _activation(m: Any) -> Call:
    fn = _OUT_OF_PLACE_AND_IN_PLACE[type(m)][bool(m.inplace)]
    bounds = (m.min_val, m.max_val) if isinstance(m, nn.Hardtanh) else ()
    return Call(fn, bounds)


# Quantized convolutions end in one quantized:: op on their packed weights. Their forward first
# checks the input's rank in Python (``len(input.shape) != 4``: raise), which TorchScript keeps
# in the frozen graph as size / len / ne / prim::If before every convolution (62 of them in
# quantized mobilenet_v3_large); the op checks the rank itself.
_QUANTIZED_CONV = {
    nnq.Conv1d: torch.ops.quantized.conv1d,
    nnq.Conv2d: torch.ops.quantized.conv2d,
    nnq.Conv3d: torch.ops.quantized.conv3d,
    nniq.ConvReLU1d: torch.ops.quantized.conv1d_relu,
    nniq.ConvReLU2d: torch.ops.quantized.conv2d_relu,
    nniq.ConvReLU3d: torch.ops.quantized.conv3d_relu,
}


def _quantized_conv(m: Any) -> Call | None:
    if m.padding_mode != "zeros":  # forward pads with F.pad first
        return None
    args = (Attr("_packed_params"), float(m.scale), int(m.zero_point))
    return Call(_QUANTIZED_CONV[type(m)], args)


# exact module type -> what its forward computes (None keeps the call)
INLINERS: dict[type[nn.Module], Callable[[Any], Call | None]] = {
    **dict.fromkeys(_CONV, _conv),
    **dict.fromkeys(_CONV_TRANSPOSE, _conv_transpose),
    **dict.fromkeys(_MAX_POOL, _max_pool),
    **dict.fromkeys(_OUT_OF_PLACE_AND_IN_PLACE, _activation),
    nn.Linear: lambda m: Call(F.linear, _WEIGHT_BIAS),
    nn.Sigmoid: lambda m: Call(torch.sigmoid),
    nn.Tanh: lambda m: Call(torch.tanh),
    nn.GELU: lambda m: Call(F.gelu, kwargs={"approximate": m.approximate}),
    nn.AvgPool2d: _avg_pool_2d,
    nn.Flatten: lambda m: Call(torch.flatten, (m.start_dim, m.end_dim)),
    nn.AdaptiveAvgPool1d: lambda m: Call(F.adaptive_avg_pool1d, (m.output_size,)),
    **dict.fromkeys(_ADAPTIVE_AVG_POOL, _adaptive_avg_pool),
    **dict.fromkeys(_QUANTIZED_CONV, _quantized_conv),
}


class InlineModules(FxPass):
    """Replace each call to a module type in ``INLINERS`` with the functional call it makes.

    Leaves subclasses, modules with hooks or an instance ``forward``, and every other module type.
    """

    optimization = MobileOptimizerType.INLINE_MODULES
    summary: ClassVar[str] = (
        "conv / linear / activation / pool module calls -> the functional call their forward makes"
    )
    keeps_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        new, inlined, skips = inline_leaf_modules(gm)
        return PassResult(new, inlined, dict(skips))


def inline_leaf_modules(gm: fx.GraphModule) -> tuple[fx.GraphModule, int, Skips]:
    """A new graph module with the calls to ``INLINERS``' types inlined, how many were, and why
    the other calls to those types were kept.

    ``gm`` is left as it was; the new module holds the same tensor objects (no copies) and
    only the submodules and attributes its graph still uses.
    """
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    owners: dict[str, Any] = {}  # what each call_module / get_attr target of ``graph`` names
    hoisted: dict[int, str] = {}  # id(tensor) -> its attribute on the new root
    inlined, skips = 0, Skips()

    def hoist(module_path: str, name: str) -> fx.Node | None:
        tensor = getattr(gm.get_submodule(module_path), name)
        if tensor is None:
            return None
        if id(tensor) not in hoisted:
            attr = fresh_attr_name(gm, f"{module_path}.{name}", taken=owners)
            hoisted[id(tensor)] = attr
            owners[attr] = tensor
        return graph.get_attr(hoisted[id(tensor)])

    for node in gm.graph.nodes:
        direct = _direct_call(node)
        if direct is not None:
            op, op_args = direct
            env[node] = graph.call_function(op, fx.map_arg(op_args, lambda n: env[n]))
            env[node].meta = dict(node.meta)
            inlined += 1
            continue
        call = _inline_call(gm, node)
        if isinstance(call, str):
            skips.add(call)
        if not isinstance(call, Call):
            env[node] = graph.node_copy(node, lambda n: env[n])
            if node.op == "call_module":
                owners[str(node.target)] = module_of(gm, node)
            elif node.op == "get_attr":
                owners[str(node.target)] = attr_of(gm, node)
            continue
        path = str(node.target)
        args = [hoist(path, a.name) if isinstance(a, Attr) else a for a in call.args]
        source = env[node.args[0]]
        env[node] = graph.call_function(call.fn, (source, *args), dict(call.kwargs))
        env[node].meta = dict(node.meta)
        inlined += 1
    if not inlined:
        return gm, 0, skips
    new = fx.GraphModule(owners, graph, class_name=type(gm).__name__)
    new.meta = dict(gm.meta)
    new.training = gm.training  # the root only: the kept submodules are gm's own objects
    return new, inlined, skips


def _inline_call(gm: fx.GraphModule, node: fx.Node) -> Call | str | None:
    """What ``node``'s module call computes, why it stays a call, or None for other nodes."""
    module = module_of(gm, node)
    inliner = None if module is None else INLINERS.get(type(module))
    if module is None or inliner is None:
        return None
    if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], fx.Node):
        return f"{type(module).__name__} called with more than one input"
    customized = why_customized(module)
    if customized:
        return customized
    return inliner(module) or f"{type(module).__name__} configuration has no functional form"
