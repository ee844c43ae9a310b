"""Dropout removal on the TorchScript graph (for scripted input; eager input loses it in FX).

    dropout(x, p, train=False) -> x     (also dropout_, feature_dropout, feature_dropout_)

Only calls whose ``train`` argument is the constant False are removed, as upstream does; a
dropout whose ``train`` is True or not a constant is left and reported.
"""

from __future__ import annotations

import torch

from fxmobile.infra import Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.script.graph_utils import iter_nodes, method_graphs
from fxmobile.script.jit_passes import jit
from fxmobile.script.stage import CountingScriptPass, ScriptContext

DROPOUT_KINDS = frozenset(
    {"aten::dropout", "aten::dropout_", "aten::feature_dropout", "aten::feature_dropout_"}
)


class RemoveDropout(CountingScriptPass):
    """Remove ``aten::dropout`` / ``feature_dropout`` (and in-place forms) whose ``train`` is the
    constant False, in ``forward``; report the rest.
    """

    optimization = MobileOptimizerType.REMOVE_DROPOUT
    summary = "aten::dropout / feature_dropout (train=False) -> x"
    removed = DROPOUT_KINDS

    def rewrite(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> tuple[torch.jit.ScriptModule, dict[str, int]]:
        """torch's pass, which reads ``forward`` only; what is left is reported."""
        if module._c._has_method("forward"):
            jit._jit_pass_remove_dropout(module._c)
        skips = Skips()
        for graph in method_graphs(module, ctx.methods):
            for node in iter_nodes(graph):
                if node.kind() in DROPOUT_KINDS:
                    skips.add(f"{node.kind()} with train not the constant False, or not in forward")
        return module, dict(skips)
