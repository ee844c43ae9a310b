"""Python numbers in arithmetic, as one-element constants of the tensor's dtype.

    add(x, c), sub(x, c), mul(x, c), div(x, c)    ->  op(x, C)        C = tensor([c], x.dtype)
    add(c, x)... (a number first), rsub(x, c)     ->  op(C, x), sub(C, x)
    hardsigmoid(x)                                ->  div(hardtanh(add(x, 3), 0, 6), 6)
                                                      (ATen's own order: min(max(x + 3, 0), 6) / 6)

ATen casts a number to the tensor's dtype before the op (float32 ``x * 0.1`` multiplies by
``float(0.1)``), so a constant of that dtype computes the same. ExecuTorch's lowering turns a bare
number into an int64 or float64 constant and a ``_to_dim_order_copy`` to the tensor's dtype,
which XNNPACK declines ("dtype conversion is not supported"): a copy on a portable kernel beside
each ``x + 1`` and ``x / 2``, and two per ``hardsigmoid`` (ExecuTorch decomposes it into exactly
those ops with bare numbers; mobilenet_v3_small has nine).

Left alone, with the reason: ``add`` and ``sub`` with an ``alpha`` other than 1, a tensor of a
dtype other than float32, and a tensor whose dtype is unknown.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import aten, call, dtype, scalar
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.graph_utils import replace_node
from fxmobile.passes.stage import FxContext, FxPass

BINARY = frozenset({aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor})
# The same ops with the number as their second argument by schema: op(x, c).
SCALAR_FORMS = {
    aten.add.Scalar: aten.add.Tensor,
    aten.sub.Scalar: aten.sub.Tensor,
    aten.mul.Scalar: aten.mul.Tensor,
    aten.div.Scalar: aten.div.Tensor,
}


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def number(value: Any) -> float:
    """A number argument, as the float its constant holds."""
    return float(value)


def can_rewrite(node: fx.Node) -> str | bool:
    """True when ``node`` has a number to turn into a constant, a reason when it must keep it,
    False when it has none."""
    if node.op != "call_function":
        return False
    target = node.target
    if target is aten.hardsigmoid.default:
        tensor = node.args[0]
    elif target in BINARY or target in SCALAR_FORMS or target is aten.rsub.Scalar:
        numbers = [a for a in node.args[:2] if _number(a)]
        if not numbers or len(numbers) == 2:
            return False
        tensor = next(a for a in node.args[:2] if not _number(a))
        if node.kwargs.get("alpha", 1) != 1 or (len(node.args) > 2 and node.args[2] != 1):
            return "alpha is not 1"
    else:
        return False
    found = dtype(tensor)
    if found is None:
        return "dtype unknown (pass example_inputs)"
    if found is not torch.float32:
        return f"{found} tensor: the XNNPACK delegate computes float32"
    return True


def rewrite(gm: fx.GraphModule, node: fx.Node) -> fx.Node:
    """The replacement of ``node``, inserted before it."""
    graph = gm.graph
    f32 = torch.float32
    with graph.inserting_before(node):
        if node.target is aten.hardsigmoid.default:
            shifted = call(graph, aten.add.Tensor, node.args[0], scalar(gm, "three", 3.0, f32))
            clamped = call(graph, aten.hardtanh.default, shifted, 0.0, 6.0)
            return call(graph, aten.div.Tensor, clamped, scalar(gm, "six", 6.0, f32))
        a, b = node.args[0], node.args[1]
        target: Any = node.target
        if target is aten.rsub.Scalar:  # rsub(x, c) = c - x
            return call(graph, aten.sub.Tensor, scalar(gm, "scalar", number(b), f32), a)
        op = SCALAR_FORMS.get(target, target)
        if _number(a):
            return call(graph, op, scalar(gm, "scalar", number(a), f32), b)
        return call(graph, op, a, scalar(gm, "scalar", number(b), f32))


class ScalarsAsConstants(FxPass):
    """Give every number in float32 arithmetic (and ``hardsigmoid``'s) a float32 constant."""

    optimization = MobileOptimizerType.SCALARS_AS_CONSTANTS
    summary: ClassVar[str] = "x + 1, x / 2, hardsigmoid(x) -> the numbers as float32 constants"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            found = can_rewrite(node)
            if isinstance(found, str):
                skips.add(found)
            elif found:
                replace_node(node, rewrite(gm, node))
                rewrites += 1
        return PassResult(gm, rewrites, dict(skips))
