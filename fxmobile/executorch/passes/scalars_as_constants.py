"""Python numbers in arithmetic, as one-element constants of the tensor's dtype.

    add(x, c), sub(x, c), mul(x, c), div(x, c)    ->  op(x, C)        C = c of x's dtype, its
    add(c, x)... (a number first), rsub(x, c)     ->  op(C, x), sub(C, x)     dims all of size 1
    hardsigmoid(x)                                ->  div(hardtanh(add(x, 3), 0, 6), 6)
                                                      (ATen's own order: min(max(x + 3, 0), 6) / 6)
    addcmul(b, t, u, value=v)                     ->  add(b, mul(mul(V, t), u))   (v = 1: no V)
    addcdiv(b, t, u, value=v)                     ->  add(b, div(mul(V, t), u))

ATen casts a number to the tensor's dtype before the op (float32 ``x * 0.1`` multiplies by
``float(0.1)``), so a constant of that dtype computes the same. ExecuTorch's lowering turns a bare
number into an int64 or float64 constant and a ``_to_dim_order_copy`` to the tensor's dtype,
which XNNPACK declines ("dtype conversion is not supported"): a copy on a portable kernel beside
each ``x + 1`` and ``x / 2``, two per ``hardsigmoid`` and one per ``addcmul`` (ExecuTorch
decomposes them into exactly these ops with bare numbers; mobilenet_v3_small has nine
hardsigmoids, timm's ResMLP an ``addcmul`` in every block).

Each rewrite is ATen's own ops in ATen's order, so eager computes the same bits, with one
exception: ATen's float ``addcmul`` kernel fuses its last multiply and add (measured on x86: bit
for bit ``fma(v * t, u, b)``), the rewrite rounds the product first. The two differ by at most
the rounding of the product, and where ``v * t * u`` alone overflows while the sum would not
(an input within a factor of two of the float32 maximum); ExecuTorch's own decomposition rounds
the same way.

Left alone, with the reason: ``add`` and ``sub`` with an ``alpha`` other than 1, a tensor of a
dtype other than float32, and a tensor whose dtype is unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import argument, aten, call, dtype, replace_with, scalar
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

BINARY = frozenset({aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor})
# The same ops with the number as their second argument by schema: op(x, c).
SCALAR_FORMS = {
    aten.add.Scalar: aten.add.Tensor,
    aten.sub.Scalar: aten.sub.Tensor,
    aten.mul.Scalar: aten.mul.Tensor,
    aten.div.Scalar: aten.div.Tensor,
}
# b + value * t (op) u, the op between the two tensors
POINTWISE = {aten.addcmul.default: aten.mul.Tensor, aten.addcdiv.default: aten.div.Tensor}


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
    if target in POINTWISE:
        return _all_float32(node.args[:3])
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
    return _all_float32([tensor])


def _all_float32(tensors: Sequence[Any]) -> str | bool:
    """True when each of ``tensors`` is float32, else the reason to leave their op alone."""
    for found in (dtype(t) for t in tensors):
        if found is None:
            return "dtype unknown (pass example_inputs)"
        if found is not torch.float32:
            return f"{found} tensor: the XNNPACK delegate computes float32"
    return True


def rewrite(gm: fx.GraphModule, node: fx.Node) -> fx.Node:
    """The replacement of ``node``, inserted before it."""
    graph = gm.graph
    with graph.inserting_before(node):
        if node.target in POINTWISE:
            return _pointwise(gm, node)
        if node.target is aten.hardsigmoid.default:
            x = node.args[0]
            shifted = call(graph, aten.add.Tensor, x, scalar(gm, "three", 3.0, x))
            clamped = call(graph, aten.hardtanh.default, shifted, 0.0, 6.0)
            return call(graph, aten.div.Tensor, clamped, scalar(gm, "six", 6.0, x))
        a, b = node.args[0], node.args[1]
        target: Any = node.target
        if target is aten.rsub.Scalar:  # rsub(x, c) = c - x
            return call(graph, aten.sub.Tensor, scalar(gm, "scalar", number(b), a), a)
        op = SCALAR_FORMS.get(target, target)
        if _number(a):
            return call(graph, op, scalar(gm, "scalar", number(a), b), b)
        return call(graph, op, a, scalar(gm, "scalar", number(b), a))


def _pointwise(gm: fx.GraphModule, node: fx.Node) -> fx.Node:
    """``addcmul`` or ``addcdiv`` as ATen computes it: ``b + (value * t) op u``."""
    graph = gm.graph
    base, t, u = node.args[:3]
    target: Any = node.target
    value = number(argument(node, 3, "value", 1))
    if value != 1.0:  # 1 * t is t, bit for bit (NaN, the infinities and -0 included)
        t = call(graph, aten.mul.Tensor, scalar(gm, "value", value, t), t)
    return call(graph, aten.add.Tensor, base, call(graph, POINTWISE[target], t, u))


class ScalarsAsConstants(FxPass):
    """Give every number in float32 arithmetic (``hardsigmoid``'s, ``addcmul``'s and
    ``addcdiv``'s too) a float32 constant."""

    optimization = MobileOptimizerType.SCALARS_AS_CONSTANTS
    summary: ClassVar[str] = (
        "x + 1, x / 2, hardsigmoid(x), addcmul(b, t, u) -> the numbers as float32 constants"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            found = can_rewrite(node)
            if isinstance(found, str):
                skips.add(found)
            elif found:
                replace_with(node, rewrite(gm, node))
                rewrites += 1
        return PassResult(gm, rewrites, dict(skips))
