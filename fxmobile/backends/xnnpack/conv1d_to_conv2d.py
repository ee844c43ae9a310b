"""conv1d as conv2d, so backends that only prepack 2-D convolutions can take it.

    conv1d(x, W, b, s, p, d, g) -> squeeze(conv2d(unsqueeze(x, 2), unsqueeze(W, 2), b,
                                              [1, s], [0, p], [1, d], g), 2)

Upstream's ``CONV_1D_TO_2D`` (missing from its Python enum); torch's own pass does the rewrite.
That pass rewrites every conv1d of the module and builds a broken graph for string padding
(``padding='same'``), which later constant propagation trips over with an internal assert; so
when any conv1d has string padding the pass leaves the module as it is and says so.

Its rewrite also ignores aliasing: the new nodes can land after an in-place op that wrote the
conv1d's input (``hardtanh_(v); conv1d(v)`` became ``conv2d(v); hardtanh_(v)``, and the write,
now unused, was then removed as dead code: found by the fuzzer). So a method that writes any
tensor in place is left alone too; ``remove_mutation`` in the FX stage usually has made such
writes functional by then.
"""

from __future__ import annotations

import torch

from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.script.aliasing import writers
from fxmobile.script.graph_utils import count_kinds, iter_nodes, method_graphs
from fxmobile.script.jit_passes import jit
from fxmobile.script.stage import ScriptContext, ScriptPass


def _writes_in_place(module: torch.jit.ScriptModule, methods: tuple[str, ...]) -> int:
    """Nodes that write one of their tensor inputs, in methods that have a conv1d."""
    return sum(
        len(writers(graph))
        for graph in method_graphs(module, methods)
        if any(node.kind() == "aten::conv1d" for node in iter_nodes(graph))
    )


def _string_padded(module: torch.jit.ScriptModule, methods: tuple[str, ...]) -> int:
    return sum(
        1
        for graph in method_graphs(module, methods)
        for node in iter_nodes(graph)
        if node.kind() == "aten::conv1d"
        and not isinstance(node.inputsAt(4).type(), torch._C.ListType)
    )


class Conv1dToConv2d(ScriptPass):
    """torch's conv1d -> conv2d rewrite, run only on methods where it cannot reorder a write."""

    optimization = MobileOptimizerType.CONV_1D_TO_2D
    summary = "aten::conv1d -> unsqueeze, aten::conv2d, squeeze"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        unsupported = _string_padded(module, ctx.methods)
        if unsupported:
            return PassResult(module, 0, {"conv1d with string padding": unsupported})
        writes = _writes_in_place(module, ctx.methods)
        if writes:
            return PassResult(module, 0, {"method writes tensors in place": writes})
        before = count_kinds(module, ctx.methods, {"aten::conv1d"})
        jit._jit_pass_transform_conv1d_to_conv2d(module._c)
        return PassResult(module, before - count_kinds(module, ctx.methods, {"aten::conv1d"}))
