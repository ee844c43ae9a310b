"""conv1d as conv2d, so backends that only prepack 2-D convolutions can take it.

    conv1d(x, W, b, s, p, d, g) -> squeeze(conv2d(unsqueeze(x, 2), unsqueeze(W, 2), b,
                                              [1, s], [0, p], [1, d], g), 2)

Upstream's ``CONV_1D_TO_2D`` (missing from its Python enum); torch's own pass does the rewrite.
"""

from __future__ import annotations

import torch

from fxmobile.options import MobileOptimizerType
from fxmobile.script.infra import CountingScriptPass, ScriptContext
from fxmobile.script.jit_passes import jit


class Conv1dToConv2d(CountingScriptPass):
    optimization = MobileOptimizerType.CONV_1D_TO_2D
    summary = "aten::conv1d -> unsqueeze, aten::conv2d, squeeze"
    removed = frozenset({"aten::conv1d"})

    def rewrite(self, module: torch.jit.ScriptModule, ctx: ScriptContext) -> torch.jit.ScriptModule:
        jit._jit_pass_transform_conv1d_to_conv2d(module._c)
        return module
