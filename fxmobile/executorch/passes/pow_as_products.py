"""Powers with the exponents ATen computes by multiplying, written as those products.

    pow(x, 2)   ->  x * x                  pow(x, -1)  ->  1 / x
    pow(x, 3)   ->  (x * x) * x            pow(x, -2)  ->  1 / (x * x)
    pow(x, 1)   ->  a copy of x            (an integer or a float exponent alike: 2 or 2.0)

ATen's float kernel for ``pow(Tensor, Scalar)`` never calls ``pow`` for these exponents: it
computes ``base * base``, ``base * base * base`` and ``1 / (base * base)`` for 2, 3 and -2,
``reciprocal`` (``1 / base``) for -1, and copies for 1 (``aten/src/ATen/native/Pow.cpp``,
``cpu/PowKernel.cpp``). The rewrite is the same ops in the same order, so eager computes the same
bits, NaN, infinities and signed zeros included, and so does XNNPACK (measured: its ``mul`` and
``div`` agree with eager's at NaN, the infinities and the zeros; like every XNNPACK op they flush
subnormal numbers to zero). ExecuTorch's XNNPACK partitioner takes ``pow`` only with the integer
exponent 2 ("only support int powers, got 2.0"), and ``mul`` and ``div`` always. The 1 is a
constant with as many dims as ``x``, all of size 1, so ``1 / x`` keeps the shape of a 0-d ``x``.

Left alone, with the reason:

- 0.5 and -0.5, which ATen computes as ``sqrt`` and ``rsqrt``: bit for bit the same in eager, but
  XNNPACK's ``sqrt`` is NaN at +inf (eager: +inf) and its ``rsqrt`` NaN at 0 (eager: +inf), and
  both are 1.5 times too large near the float32 maximum (measured, ExecuTorch 1.5.1 on x86), so
  the delegate would compute something else where ExecuTorch's portable ``pow`` does not;
- any other exponent: ATen calls ``pow``, correctly rounded, which a chain of products would not
  match bit for bit (0 gives ones whatever ``x`` is);
- a base of a dtype other than float32, or whose dtype or shape is unknown.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import aten, call, dtype, replace_with, scalar, shape
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

EXPONENTS = (2.0, 3.0, -1.0, -2.0, 1.0)
# ATen computes these with ops XNNPACK gets wrong at the ends of the float range.
ROOTS = {
    0.5: "exponent 0.5: XNNPACK's sqrt is NaN at +inf, where eager's pow is +inf",
    -0.5: "exponent -0.5: XNNPACK's rsqrt is NaN at 0, where eager's pow is +inf",
}


def can_multiply(node: fx.Node) -> float | str | None:
    """The exponent of ``node``'s power, a reason to stay, or None when it is no power of a
    tensor by a number."""
    if node.op != "call_function" or node.target is not aten.pow.Tensor_Scalar:
        return None
    exponent = node.args[1]
    if isinstance(exponent, int | float) and float(exponent) in ROOTS:
        return ROOTS[float(exponent)]
    if not isinstance(exponent, int | float) or float(exponent) not in EXPONENTS:
        return f"exponent {exponent}: ATen computes it with pow, which products would not match"
    found = dtype(node.args[0])
    if found is None or shape(node.args[0]) is None:
        return "dtype or shape unknown (pass example_inputs)"
    if found is not torch.float32:
        return f"{found} base: the XNNPACK delegate computes float32"
    return float(exponent)


def multiply(gm: fx.GraphModule, node: fx.Node, exponent: float) -> fx.Node:
    """ATen's ops for ``pow(x, exponent)``, inserted before ``node``; their output."""
    graph = gm.graph
    x = node.args[0]
    with graph.inserting_before(node):
        if exponent == 1.0:
            return call(graph, aten.clone.default, x)
        if exponent == -1.0:
            return call(graph, aten.div.Tensor, scalar(gm, "one", 1.0, x), x)
        square = call(graph, aten.mul.Tensor, x, x)
        if exponent == 2.0:
            return square
        if exponent == 3.0:
            return call(graph, aten.mul.Tensor, square, x)
        return call(graph, aten.div.Tensor, scalar(gm, "one", 1.0, x), square)


class PowAsProducts(FxPass):
    """Write ``pow`` with exponent 2, 3, -1, -2 or 1 as the products ATen computes it with."""

    optimization = MobileOptimizerType.POW_AS_PRODUCTS
    summary: ClassVar[str] = "pow(x, 2 | 3 | -1 | -2) -> x*x, x*x*x, 1/x, 1/(x*x)"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            exponent = can_multiply(node)
            if isinstance(exponent, str):
                skips.add(exponent)
            elif exponent is not None:
                replace_with(node, multiply(gm, node, exponent))
                rewrites += 1
        return PassResult(gm, rewrites, dict(skips))
