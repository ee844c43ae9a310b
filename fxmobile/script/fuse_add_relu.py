"""Add followed by ReLU as one kernel.

relu(add(a, b, alpha))    -> _add_relu(a, b, alpha)
relu_(add(a, b, alpha))   -> _add_relu(a, b, alpha)
relu_(add_(a, b, alpha))  -> _add_relu_(a, b, alpha)
"""

from __future__ import annotations

import torch

from fxmobile.options import MobileOptimizerType
from fxmobile.script.graph_utils import method_graphs
from fxmobile.script.infra import CountingScriptPass, ScriptContext
from fxmobile.script.jit_passes import jit


class FuseAddRelu(CountingScriptPass):
    optimization = MobileOptimizerType.FUSE_ADD_RELU
    summary = "add (+ relu / relu_) -> aten::_add_relu"
    created = frozenset({"aten::_add_relu", "aten::_add_relu_"})

    def rewrite(self, module: torch.jit.ScriptModule, ctx: ScriptContext) -> torch.jit.ScriptModule:
        for graph in method_graphs(module, ctx.methods):
            jit._jit_pass_fuse_add_relu(graph)
        return module
