"""Recover ``aten::linear`` from the forms a frozen graph may hold it in.

    addmm(b, x, W.t())          -> linear(x, W, b)      # torch's FuseLinear, weight not constant
    matmul(x, W.t()) + b        -> linear(x, W, b)
    addmm(b, x, C)              -> linear(x, C.t(), b)  # C constant 2-D; beta = alpha = 1
    add(matmul(x, C), b)        -> linear(x, C.t(), b)  # b constant 1-D of C's width
    matmul(x, C)                -> linear(x, C.t())

Freezing folds ``W.t()`` into a constant, which hides the first two forms from torch's pass
(and from upstream, which runs it after freezing): the constant forms are matched here, with
the transposed weight made contiguous once. Backends prepack ``aten::linear`` only, so this runs
before them; upstream does it inside ``INSERT_FOLD_PREPACK_OPS``, which also switches it off here.
"""

from __future__ import annotations

from typing import Any

import torch

from fxmobile.options import MobileOptimizerType
from fxmobile.script.graph_utils import iter_nodes, method_graphs
from fxmobile.script.jit_passes import jit
from fxmobile.script.stage import CountingScriptPass, ScriptContext


def _linear_operands(node: torch._C.Node) -> tuple[Any, Any, Any] | None:
    """(x, weight, bias) values and constants for a constant-weight linear form, else None."""
    inputs = list(node.inputs())
    if node.kind() == "aten::addmm":
        bias, x, mat = inputs[0], inputs[1], inputs[2].toIValue()
        if inputs[3].toIValue() != 1 or inputs[4].toIValue() != 1:
            return None
        b = bias.toIValue()
    elif node.kind() == "aten::add" and inputs[0].node().kind() == "aten::matmul":
        matmul = inputs[0].node()
        if len(inputs[0].uses()) != 1 or inputs[2].toIValue() != 1:
            return None
        x, mat, b = matmul.inputsAt(0), matmul.inputsAt(1).toIValue(), inputs[1].toIValue()
    elif node.kind() == "aten::matmul":
        x, mat, b = inputs[0], inputs[1].toIValue(), None
    else:
        return None
    if not isinstance(mat, torch.Tensor) or mat.dim() != 2 or not mat.is_floating_point():
        return None
    if node.kind() != "aten::matmul":
        if not isinstance(b, torch.Tensor) or b.dim() != 1 or b.shape[0] != mat.shape[1]:
            return None
        if b.dtype != mat.dtype:
            return None
    return x, mat.t().contiguous(), b


def fuse_constant_linears(graph: torch._C.Graph) -> None:
    # Additions first, so a matmul takes its bias along; then the matmuls left alone.
    """Rewrite ``graph``'s addmm / matmul (+ add) on a constant weight as ``aten::linear``."""
    for kinds in ({"aten::addmm", "aten::add"}, {"aten::matmul"}):
        _fuse(graph, kinds)


def _fuse(graph: torch._C.Graph, kinds: set[str]) -> None:
    g: Any = graph  # torch's stubs omit Graph.insertConstant
    for node in list(iter_nodes(graph)):
        if node.kind() not in kinds:
            continue
        operands = _linear_operands(node)
        if operands is None:
            continue
        x, weight, bias = operands
        if node.kind() == "aten::addmm" and x.type().dim() not in (None, 2):
            continue
        with graph.insert_point_guard(node):
            linear = g.insert("aten::linear", [x, g.insertConstant(weight), g.insertConstant(bias)])
        linear.setType(node.output().type())
        node.output().replaceAllUsesWith(linear)
        matmul = node.inputsAt(0).node() if node.kind() == "aten::add" else None
        node.destroy()
        if matmul is not None and not matmul.output().uses():
            matmul.destroy()


class FuseLinear(CountingScriptPass):
    """Recover ``aten::linear`` from addmm and matmul (+ add): torch's pass, then constant forms.

    Declines nothing: a form neither matches stays as it is, unreported.
    """

    optimization = MobileOptimizerType.INSERT_FOLD_PREPACK_OPS
    summary = "addmm / matmul (+ add) -> aten::linear"
    created = frozenset({"aten::linear"})

    def rewrite(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> tuple[torch.jit.ScriptModule, dict[str, int]]:
        """torch's linear recovery, then the constant-weight forms; nothing is declined."""
        for graph in method_graphs(module, ctx.methods):
            jit._jit_pass_fuse_linear(graph)
            fuse_constant_linears(graph)
        return module, {}
