"""Conv + BatchNorm folding on a ``ScriptModule`` (for models that arrive already scripted).

    conv(x, W, b) -> batch_norm(., mean, var, gamma, beta, eps)  =>  conv(x, W', b')
    W' = W * gamma / sqrt(var + eps),  b' = (b - mean) * gamma / sqrt(var + eps) + beta

Eager models get this from the FX stage (which also covers transposed convs, linear and the
functional forms); this is torch's module-level pass for scripted input, run before freezing
(it clones the module, so the caller's types are never touched). The count is the number of
BatchNorm modules no longer called: inlining duplicates a call made in both branches of an
``if`` (mobilenet_v2's residual blocks), so graph nodes would count some twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.script.graph_utils import iter_nodes
from fxmobile.script.jit_passes import jit
from fxmobile.script.stage import ScriptContext, ScriptPass


def _access_path(value: torch._C.Value) -> str:
    parts = []
    while value.node().kind() == "prim::GetAttr":
        parts.append(value.node().s("name"))
        value = value.node().inputsAt(0)
    return ".".join(reversed(parts))


def batchnorms_called(module: torch.jit.ScriptModule, methods: Sequence[str]) -> set[str]:
    """The BatchNorm modules ``methods`` call, named by the path to their running mean."""
    called = set()
    for name in methods:
        for node in iter_nodes(module._c._get_method(name).inlined_graph):
            if node.kind() == "aten::batch_norm":
                called.add(_access_path(node.inputsAt(3)))
    return called


class FoldConvBatchNorm(ScriptPass):
    optimization = MobileOptimizerType.CONV_BN_FUSION
    summary = "Conv2d/3d -> BatchNorm (scripted) -> Conv with folded weight and bias"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        before = batchnorms_called(module, ctx.methods)
        folded = torch.jit._recursive.wrap_cpp_module(jit._jit_pass_fold_convbn(module._c))
        return PassResult(folded, len(before - batchnorms_called(folded, ctx.methods)))
