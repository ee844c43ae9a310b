"""Canonical optimizations after freezing, as upstream runs them on every method.

Dead code elimination, common subexpression elimination, peephole simplification, constant
propagation and constant pooling. The rewrite count is the number of nodes that went.
"""

from __future__ import annotations

import torch

from fxmobile.infra import PassResult
from fxmobile.script.graph_utils import method_graphs, node_count
from fxmobile.script.jit_passes import jit
from fxmobile.script.stage import ScriptContext, ScriptPass


class Canonicalize(ScriptPass):
    """Run torch's DCE, CSE, peephole, constant propagation and pooling on every method's graph.

    Declines nothing and always runs (no blocklist member); the count is the nodes that went.
    """

    optimization = None
    summary = "dead code, common subexpressions, peephole, constants -> removed or folded"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        before = node_count(module, ctx.methods)
        for graph in method_graphs(module, ctx.methods):
            jit._jit_pass_dce(graph)
            jit._jit_pass_cse(graph)
            jit._jit_pass_peephole(graph, False)
            jit._jit_pass_constant_propagation(graph)
            jit._jit_pass_constant_pooling(graph)
            jit._jit_pass_dce(graph)
        return PassResult(module, max(before - node_count(module, ctx.methods), 0))
