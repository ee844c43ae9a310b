"""Shapes and dtypes of a frozen graph's tensors that follow from the example inputs without a run.

A frozen graph records neither (freezing erases even a traced graph's types), so a pass that
needs them ran the method once on the example inputs (``probe``). For the ops mobile graphs are
mostly made of, they follow from the inputs' and from constants instead: a prepacked op's from
the weights and arguments in its packed context (a constant, or the attribute fold_prepacking
stored it in), pooling's from its constant arguments, an elementwise op's by broadcasting.
``static_shapes`` walks the top-level block in order and records a tensor only when its rule
proves it; any other op, an argument that is not a constant, an integer tensor, or two operands
of different dtypes leave the result out, and the caller runs the method for what it still
needs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from fxmobile.script.graph_utils import iter_nodes


class Meta(NamedTuple):
    """A tensor's sizes and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def static_shapes(
    module: torch.jit.ScriptModule, graph: torch._C.Graph, inputs: Sequence[Any]
) -> dict[torch._C.Value, Meta]:
    """Sizes and dtype of every tensor of ``graph``'s top-level block (a method of ``module``)
    whose ones follow from ``inputs`` (the method's arguments, without ``self``) by the rules
    below."""
    walk = _Walk(module, graph)
    for value, arg in zip(list(graph.inputs())[1:], inputs, strict=False):
        if isinstance(arg, torch.Tensor) and isinstance(value.type(), torch._C.TensorType):
            walk.known[value] = Meta(tuple(arg.shape), arg.dtype)
    for node in graph.nodes():
        rule = _RULES.get(node.kind())
        if rule is None or node.outputsSize() != 1:
            continue
        try:
            walk.known[node.output()] = rule(node, walk)
        except _NotProvedError:
            continue
    return walk.known


class _Walk:
    """What the walk has proved so far, and where a run op's context comes from."""

    def __init__(self, module: torch.jit.ScriptModule, graph: torch._C.Graph) -> None:
        self.known: dict[torch._C.Value, Meta] = {}
        self.module = module
        self.self_value = next(iter(graph.inputs()))
        # an attribute the method itself may set is read as it is when the method runs
        self.attributes_fixed = not any(n.kind() == "prim::SetAttr" for n in iter_nodes(graph))

    def attribute(self, value: torch._C.Value) -> Any:
        """A constant's value, or the object a chain of ``prim::GetAttr`` from ``self`` reads."""
        node = value.node()
        if node.kind() == "prim::Constant":
            return value.toIValue()
        names = []
        while node.kind() == "prim::GetAttr":
            names.append(node.s("name"))
            value = node.inputsAt(0)
            node = value.node()
        if not names or value is not self.self_value or not self.attributes_fixed:
            raise _NotProvedError
        found: Any = self.module._c
        for name in reversed(names):
            found = found.getattr(name)
        return found


@functools.cache
def scalar_type_number(dtype: torch.dtype) -> int:
    """The number TorchScript's ``prim::dtype`` gives for ``dtype``."""
    graph = torch._C.parse_ir("graph(%x : Tensor):\n  %d : int = prim::dtype(%x)\n  return (%d)")
    number: int = torch._C._create_function_from_graph("dtype_number", graph)(
        torch.empty(0, dtype=dtype)
    )
    return number


class _NotProvedError(Exception):
    """A rule cannot prove its result."""


def _meta(value: torch._C.Value, walk: _Walk) -> Meta:
    meta = walk.known.get(value)
    if meta is None:
        raise _NotProvedError
    return meta


def _floating(value: torch._C.Value, walk: _Walk) -> Meta:
    meta = _meta(value, walk)
    if not meta.dtype.is_floating_point:
        raise _NotProvedError
    return meta


def _constant(value: torch._C.Value) -> Any:
    if value.node().kind() != "prim::Constant":
        raise _NotProvedError
    return value.toIValue()


def _ints(value: torch._C.Value, rank: int) -> list[int]:
    """A constant int list, an int list of one element broadcast to ``rank``."""
    found = _constant(value)
    if isinstance(found, int):
        found = [found]
    if not isinstance(found, list) or not all(isinstance(i, int) for i in found):
        raise _NotProvedError
    if len(found) == 1:
        found = found * rank
    if len(found) != rank:
        raise _NotProvedError
    return found


def _not_tensors(node: torch._C.Node, start: int) -> None:
    """The inputs from ``start`` on hold no tensor (``clamp(x, min_tensor)`` broadcasts)."""
    if any("Tensor" in str(v.type()) for v in list(node.inputs())[start:]):
        raise _NotProvedError


def _same(node: torch._C.Node, walk: _Walk) -> Meta:
    """Activations, clamps, copies: the floating input's sizes and dtype (a scalar argument
    does not promote within its category; an integer input might, so it is left out)."""
    _not_tensors(node, 1)
    return _floating(node.inputsAt(0), walk)


def _broadcast(node: torch._C.Node, walk: _Walk) -> Meta:
    """add, sub, mul, div (and ``_add_relu``): two floating tensors of one dtype broadcast; a
    floating tensor and a scalar keep the tensor's. The in-place forms keep their first
    operand's sizes (they raise when it would broadcast)."""
    first = _floating(node.inputsAt(0), walk)
    _not_tensors(node, 2)
    other = node.inputsAt(1)
    if not isinstance(other.type(), torch._C.TensorType):
        if not isinstance(other.type(), (torch._C.IntType, torch._C.FloatType)):
            raise _NotProvedError
        return first
    second = _floating(other, walk)
    if second.dtype != first.dtype:
        raise _NotProvedError  # a 0-dim operand of another dtype may or may not promote
    if node.kind().endswith("_"):
        return first
    return Meta(torch.broadcast_shapes(first.shape, second.shape), first.dtype)


_CONTEXTS = frozenset(
    f"__torch__.torch.classes.xnnpack.{name}"
    for name in ("Conv2dOpContext", "TransposeConv2dOpContext", "LinearOpContext")
)


def _context_state(node: torch._C.Node, walk: _Walk) -> tuple[Any, ...]:
    """The pickled state of a run op's context (its prepack's arguments)."""
    context = walk.attribute(node.inputsAt(1))
    if (
        not isinstance(context, torch.ScriptObject)
        or context._type().qualified_name() not in _CONTEXTS
    ):
        raise _NotProvedError
    # From Python, a custom class's __getstate__ comes with the class's name: (state, name).
    pickled: Any = context.__getstate__()
    state = pickled[0]
    if not isinstance(state, tuple) or not isinstance(state[0], torch.Tensor):
        raise _NotProvedError
    return state


def _pair(found: Any) -> list[int]:
    """A context's stride, padding...: two ints, or one for both dimensions."""
    if not isinstance(found, list | tuple) or not all(isinstance(i, int) for i in found):
        raise _NotProvedError
    if len(found) == 1:
        return [found[0]] * 2
    if len(found) != 2:
        raise _NotProvedError
    return list(found)


def _conv_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _conv2d_run(node: torch._C.Node, walk: _Walk) -> Meta:
    """``prepacked::conv2d_clamp_run``: state (W, B, stride, padding, dilation, groups, min,
    max)."""
    x = _floating(node.inputsAt(0), walk)
    weight, _, *arguments = _context_state(node, walk)[:5]
    stride, padding, dilation = (_pair(a) for a in arguments)
    if len(x.shape) != 4 or weight.dim() != 4:
        raise _NotProvedError
    spatial = [
        _conv_size(x.shape[2 + i], weight.shape[2 + i], stride[i], padding[i], dilation[i])
        for i in range(2)
    ]
    return Meta((x.shape[0], weight.shape[0], *spatial), x.dtype)


def _conv_transpose2d_run(node: torch._C.Node, walk: _Walk) -> Meta:
    """``prepacked::conv2d_transpose_clamp_run``: state (W, B, stride, padding, output_padding,
    dilation, groups, min, max); W is (in, out / groups, kh, kw)."""
    x = _floating(node.inputsAt(0), walk)
    weight, _, *arguments, groups = _context_state(node, walk)[:7]
    stride, padding, output_padding, dilation = (_pair(a) for a in arguments)
    if len(x.shape) != 4 or weight.dim() != 4 or not isinstance(groups, int):
        raise _NotProvedError
    spatial = [
        (x.shape[2 + i] - 1) * stride[i] - 2 * padding[i]
        + dilation[i] * (weight.shape[2 + i] - 1) + output_padding[i] + 1
        for i in range(2)
    ]  # fmt: skip
    return Meta((x.shape[0], weight.shape[1] * groups, *spatial), x.dtype)


def _linear_run(node: torch._C.Node, walk: _Walk) -> Meta:
    """``prepacked::linear_clamp_run``: state (W, B, min, max); W is (out, in)."""
    x = _floating(node.inputsAt(0), walk)
    weight = _context_state(node, walk)[0]
    if not x.shape or weight.dim() != 2:
        raise _NotProvedError
    return Meta((*x.shape[:-1], weight.shape[0]), x.dtype)


def _pool_size(size: int, kernel: int, stride: int, padding: int, dilation: int,
               ceil_mode: bool) -> int:  # fmt: skip
    """ATen's ``pooling_output_shape``."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1  # the last window would start in the right padding
    return out


def _pool2d(node: torch._C.Node, walk: _Walk) -> Meta:
    """max_pool2d(x, kernel, stride, padding, dilation, ceil_mode) and avg_pool2d(x, kernel,
    stride, padding, ceil_mode, ...): an empty stride is the kernel's."""
    x = _floating(node.inputsAt(0), walk)
    if len(x.shape) not in (3, 4):
        raise _NotProvedError
    kernel = _ints(node.inputsAt(1), 2)
    stride = _ints(node.inputsAt(2), 2) if _constant(node.inputsAt(2)) else kernel
    padding = _ints(node.inputsAt(3), 2)
    if node.kind() == "aten::max_pool2d":
        dilation, ceil_mode = _ints(node.inputsAt(4), 2), _constant(node.inputsAt(5))
    else:
        dilation, ceil_mode = [1, 1], _constant(node.inputsAt(4))
        if _constant(node.inputsAt(6)) is not None:
            raise _NotProvedError  # divisor_override: shapes are the same, but kept simple
    if not isinstance(ceil_mode, bool):
        raise _NotProvedError
    spatial = [
        _pool_size(x.shape[-2 + i], kernel[i], stride[i], padding[i], dilation[i], ceil_mode)
        for i in range(2)
    ]
    return Meta((*x.shape[:-2], *spatial), x.dtype)


def _adaptive_pool2d(node: torch._C.Node, walk: _Walk) -> Meta:
    x = _floating(node.inputsAt(0), walk)
    if len(x.shape) not in (3, 4):
        raise _NotProvedError
    return Meta((*x.shape[:-2], *_ints(node.inputsAt(1), 2)), x.dtype)


def _flatten(node: torch._C.Node, walk: _Walk) -> Meta:
    x = _floating(node.inputsAt(0), walk)
    start, end = _constant(node.inputsAt(1)), _constant(node.inputsAt(2))
    if not isinstance(start, int) or not isinstance(end, int):
        raise _NotProvedError
    if not x.shape:
        return Meta((1,), x.dtype)
    rank = len(x.shape)
    start, end = start % rank, end % rank
    if start > end:
        raise _NotProvedError
    merged = 1
    for size in x.shape[start : end + 1]:
        merged *= size
    return Meta((*x.shape[:start], merged, *x.shape[end + 1 :]), x.dtype)


def _tensor_constant(node: torch._C.Node, walk: _Walk) -> Meta:
    found = node.output().toIValue()
    if not isinstance(found, torch.Tensor):
        raise _NotProvedError
    return Meta(tuple(found.shape), found.dtype)


def _cat(node: torch._C.Node, walk: _Walk) -> Meta:
    """cat of a list built for it alone, of floating tensors of one dtype and rank."""
    listed, dim = node.inputsAt(0), _constant(node.inputsAt(1))
    if listed.node().kind() != "prim::ListConstruct" or len(listed.uses()) != 1:
        raise _NotProvedError
    parts = [_floating(v, walk) for v in listed.node().inputs()]
    first = parts[0] if parts else None
    if first is None or not first.shape or not isinstance(dim, int):
        raise _NotProvedError
    rank = len(first.shape)
    dim %= rank
    for part in parts:
        same_elsewhere = all(
            part.shape[i] == first.shape[i] for i in range(rank) if i != dim
        ) if len(part.shape) == rank else False  # fmt: skip
        if part.dtype != first.dtype or not same_elsewhere:
            raise _NotProvedError
    size = sum(part.shape[dim] for part in parts)
    return Meta((*first.shape[:dim], size, *first.shape[dim + 1 :]), first.dtype)


_SAME = (
    "relu", "hardtanh", "hardswish", "hardsigmoid", "sigmoid", "silu", "tanh", "gelu",
    "clamp", "clamp_min", "clamp_max",
)  # fmt: skip
_BINARY = ("add", "sub", "mul", "div", "_add_relu")
_RULES: dict[str, Callable[[torch._C.Node, _Walk], Meta]] = {
    **{f"aten::{op}{tail}": _same for op in _SAME for tail in ("", "_")},
    **{f"aten::{op}": _same for op in ("contiguous", "clone", "dropout")},
    **{f"aten::{op}{tail}": _broadcast for op in _BINARY for tail in ("", "_")},
    "prepacked::conv2d_clamp_run": _conv2d_run,
    "prepacked::conv2d_transpose_clamp_run": _conv_transpose2d_run,
    "prepacked::linear_clamp_run": _linear_run,
    "aten::max_pool2d": _pool2d,
    "aten::avg_pool2d": _pool2d,
    "aten::adaptive_avg_pool2d": _adaptive_pool2d,
    "aten::flatten": _flatten,
    "aten::cat": _cat,
    "prim::Constant": _tensor_constant,
}
