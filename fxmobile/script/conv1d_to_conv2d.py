"""conv1d as conv2d, so backends that only prepack 2-D convolutions can take it.

    conv1d(x, W, b, s, p, d, g) -> squeeze(conv2d(unsqueeze(x, 2), unsqueeze(W, 2), b,
                                              [1, s], [0, p], [1, d], g), 2)

Upstream's ``CONV_1D_TO_2D`` (missing from its Python enum); torch's own pass does the rewrite.
That pass rewrites every conv1d of the module and builds a broken graph for string padding
(``padding='same'``), which later constant propagation trips over with an internal assert; so
when any conv1d has string padding the pass leaves the module as it is and says so.
"""

from __future__ import annotations

import torch

from fxmobile.options import MobileOptimizerType
from fxmobile.script.graph_utils import count_kinds, iter_nodes, method_graphs
from fxmobile.script.infra import ScriptContext, ScriptPass, ScriptPassResult
from fxmobile.script.jit_passes import jit


def _string_padded(module: torch.jit.ScriptModule, methods: tuple[str, ...]) -> int:
    return sum(
        1
        for graph in method_graphs(module, methods)
        for node in iter_nodes(graph)
        if node.kind() == "aten::conv1d"
        and not isinstance(node.inputsAt(4).type(), torch._C.ListType)
    )


class Conv1dToConv2d(ScriptPass):
    optimization = MobileOptimizerType.CONV_1D_TO_2D
    summary = "aten::conv1d -> unsqueeze, aten::conv2d, squeeze"

    def call(self, module: torch.jit.ScriptModule, ctx: ScriptContext) -> ScriptPassResult:
        unsupported = _string_padded(module, ctx.methods)
        if unsupported:
            return ScriptPassResult(module, 0, {"conv1d with string padding": unsupported})
        before = count_kinds(module, ctx.methods, {"aten::conv1d"})
        jit._jit_pass_transform_conv1d_to_conv2d(module._c)
        return ScriptPassResult(module, before - count_kinds(module, ctx.methods, {"aten::conv1d"}))
