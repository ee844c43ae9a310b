"""GELU's tanh approximation written out, because XNNPACK computes the erf GELU in its place.

    y = gelu(x, approximate="tanh")

    ->  y = (0.5 * x) * (1 + tanh(b * (x + k * ((x * x) * x))))     b = sqrt(2 / pi), k = 0.044715

ATen's kernel computes exactly these operations in this order (float32 constants), so the
rewrite differs from eager only by the rounding of ``tanh``. ExecuTorch's XNNPACK partitioner
takes ``gelu`` without looking at ``approximate`` and XNNPACK runs its erf GELU: a program from
ExecuTorch's own flow is off by about 1e-4 of the output's scale wherever a model uses the tanh
form. Each op here XNNPACK computes as written. A NaN stays NaN, +inf gives +inf, and -inf
gives NaN, as in eager (``0.5 * -inf * (1 + -1)``).

Not a candidate: the erf GELU (``approximate="none"``), which XNNPACK computes right. Left
alone, with the reason: a dtype other than float32, an input whose shape is unknown.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import (
    argument,
    aten,
    call,
    dtype,
    replace_with,
    scalar,
    shape,
)
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5  # sqrt(2 / pi), as ATen computes it
KAPPA = 0.044715


def can_decompose(node: fx.Node) -> bool | str:
    """True for a tanh GELU to write out, a reason when it must stay, False for any other
    node."""
    if node.op != "call_function" or node.target is not aten.gelu.default:
        return False
    if argument(node, 1, "approximate", "none") != "tanh":
        return False  # the erf GELU: XNNPACK's kernel is that one
    sizes, found = shape(node.args[0]), dtype(node.args[0])
    if sizes is None:
        return "input shape unknown (pass example_inputs)"
    if found is not torch.float32:
        return f"{found} input: the XNNPACK delegate computes float32"
    return True


def decompose(gm: fx.GraphModule, node: fx.Node) -> fx.Node:
    """Insert the explicit tanh GELU before ``node``; its output."""
    graph = gm.graph
    x = node.args[0]
    with graph.inserting_before(node):
        cube = call(graph, aten.mul.Tensor, call(graph, aten.mul.Tensor, x, x), x)
        inner = call(
            graph,
            aten.add.Tensor,
            x,
            call(graph, aten.mul.Tensor, cube, scalar(gm, "gelu_kappa", KAPPA, x)),
        )
        scaled = call(graph, aten.mul.Tensor, inner, scalar(gm, "gelu_beta", BETA, x))
        one_plus = call(
            graph,
            aten.add.Tensor,
            call(graph, aten.tanh.default, scaled),
            scalar(gm, "gelu_one", 1.0, x),
        )
        half = call(graph, aten.mul.Tensor, x, scalar(gm, "gelu_half", 0.5, x))
        return call(graph, aten.mul.Tensor, half, one_plus)


class DecomposeTanhGelu(FxPass):
    """Write each float32 tanh GELU as the ops of its formula."""

    optimization = MobileOptimizerType.DECOMPOSE_TANH_GELU
    summary: ClassVar[str] = "gelu(x, 'tanh') -> 0.5x * (1 + tanh(b(x + k x^3))): XNNPACK's is erf"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            found = can_decompose(node)
            if isinstance(found, str):
                skips.add(found)
            elif found:
                replace_with(node, decompose(gm, node))
                rewrites += 1
        return PassResult(gm, rewrites, dict(skips))
