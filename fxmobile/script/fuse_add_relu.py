"""Add followed by ReLU as one kernel.

relu(add(a, b, alpha))    -> _add_relu(a, b, alpha)
relu_(add(a, b, alpha))   -> _add_relu(a, b, alpha)
relu_(add_(a, b, alpha))  -> _add_relu_(a, b, alpha)

torch's rewrite places the fused node without regard to aliasing, so a graph where an add's
input shares memory with a tensor written in place elsewhere is left alone (see
``fxmobile.script.aliasing``); the resnet pattern ``relu_(a + b)`` writes only the add's own
result and still fuses.
"""

from __future__ import annotations

import torch

from fxmobile.options import MobileOptimizerType
from fxmobile.script.aliasing import root, written_roots
from fxmobile.script.graph_utils import count_kinds, iter_nodes, method_graphs
from fxmobile.script.infra import ScriptContext, ScriptPass, ScriptPassResult
from fxmobile.script.jit_passes import jit

ALIASED = "method left alone: an add reads memory that another op writes in place"
_FUSED = {"aten::_add_relu", "aten::_add_relu_"}


class FuseAddRelu(ScriptPass):
    optimization = MobileOptimizerType.FUSE_ADD_RELU
    summary = "add (+ relu / relu_) -> aten::_add_relu"

    def call(self, module: torch.jit.ScriptModule, ctx: ScriptContext) -> ScriptPassResult:
        before = count_kinds(module, ctx.methods, _FUSED)
        declined = 0
        for graph in method_graphs(module, ctx.methods):
            if _add_input_written(graph):
                declined += 1
            else:
                jit._jit_pass_fuse_add_relu(graph)
        fused = count_kinds(module, ctx.methods, _FUSED) - before
        return ScriptPassResult(module, fused, {ALIASED: declined} if declined else {})


def _add_input_written(graph: torch._C.Graph) -> bool:
    """An add's input shares memory with a tensor that another op writes in place."""
    written = written_roots(graph)
    if not written:
        return False
    for node in iter_nodes(graph):
        if node.kind() in ("aten::add", "aten::add_"):
            inputs = list(node.inputs())[:2]
            # add_ writes its own first input: that write is the pattern's, not another op's
            others = written - {root(inputs[0])} if node.kind() == "aten::add_" else written
            if any(root(v) in others for v in inputs):
                return True
    return False
