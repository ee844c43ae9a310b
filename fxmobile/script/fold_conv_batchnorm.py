"""Conv + BatchNorm folding on a ``ScriptModule`` (for models that arrive already scripted).

    conv(x, W, b) -> batch_norm(., mean, var, gamma, beta, eps)  =>  conv(x, W', b')
    W' = W * gamma / sqrt(var + eps),  b' = (b - mean) * gamma / sqrt(var + eps) + beta

Eager models get this from the FX stage (which also covers transposed convs, linear and the
functional forms); this is torch's module-level pass for scripted input, run before freezing.
"""

from __future__ import annotations

import torch

from fxmobile.options import MobileOptimizerType
from fxmobile.script.infra import CountingScriptPass, ScriptContext
from fxmobile.script.jit_passes import jit


class FoldConvBatchNorm(CountingScriptPass):
    optimization = MobileOptimizerType.CONV_BN_FUSION
    summary = "Conv2d/3d -> BatchNorm (scripted) -> Conv with folded weight and bias"
    removed = frozenset({"aten::batch_norm"})

    def rewrite(self, module: torch.jit.ScriptModule, ctx: ScriptContext) -> torch.jit.ScriptModule:
        return torch.jit._recursive.wrap_cpp_module(jit._jit_pass_fold_convbn(module._c))
