"""Dropout removal on the TorchScript graph (for scripted input; eager input loses it in FX).

    dropout(x, p, train=False) -> x     (also dropout_, feature_dropout, feature_dropout_)

Only calls whose ``train`` argument is the constant False are removed, as upstream does.
"""

from __future__ import annotations

import torch

from fxmobile.options import MobileOptimizerType
from fxmobile.script.infra import CountingScriptPass, ScriptContext
from fxmobile.script.jit_passes import jit


class RemoveDropoutScript(CountingScriptPass):
    optimization = MobileOptimizerType.REMOVE_DROPOUT
    summary = "aten::dropout / feature_dropout (train=False) -> x"
    removed = frozenset(
        {"aten::dropout", "aten::dropout_", "aten::feature_dropout", "aten::feature_dropout_"}
    )

    def rewrite(self, module: torch.jit.ScriptModule, ctx: ScriptContext) -> torch.jit.ScriptModule:
        if module._c._has_method("forward"):  # the torch pass reads forward only
            jit._jit_pass_remove_dropout(module._c)
        return module
