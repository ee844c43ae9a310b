"""Fold a BatchNorm into the conv, transposed conv or linear before it, in the frozen graph.

    y = batch_norm(producer(x, W, b), mean, var, gamma, beta, training=False, eps)
        ->  y = producer(x, W', b')     W'[o] = W[o] * s[o],  b'[o] = b[o] * s[o] + t[o]
    s = gamma / sqrt(var + eps),  t = beta - mean * s           (float64, then the weight's dtype)

Producers: ``aten::conv1d/2d/3d`` (string padding too), ``aten::conv_transpose1d/2d/3d`` (output
channels on weight axis 1, per group) and ``aten::linear``, with constant weight and bias. This is
the BatchNorm fold for every graph that reaches the TorchScript stage: a ``ScriptModule``, a
traced fallback, and what the FX stage left (a BatchNorm subclass such as timm's
``BatchNormAct2d``, once freezing has inlined its forward; a BN after a conv subclass). The FX
stage's fold (``fxmobile.passes.fold_batchnorm``) has already taken what it could.

Left alone, with a reason: a BN whose statistics are not constants or that is in training mode
(``fxmobile.script.batchnorm``), whose input is no such producer or is also read elsewhere
(reading its rank aside), whose producer's weight is not a constant, whose feature count differs
from the producer's output channels, or whose input rank is unknown or not the one where dim 1 is
the producer's channels (``fxmobile.script.batchnorm.input_ranks`` says where ranks come from).
"""

from __future__ import annotations

from typing import Any

import torch

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.affine_fold import scale_output_channels
from fxmobile.script.batchnorm import FrozenBatchNorm, batchnorms, input_ranks
from fxmobile.script.graph_utils import constant
from fxmobile.script.stage import ScriptContext, ScriptPass

# producer kind -> (spatial dims, transposed, index of groups in its arguments, None: linear)
PRODUCERS: dict[str, tuple[int, bool, int | None]] = {
    "aten::conv1d": (1, False, 6),
    "aten::conv2d": (2, False, 6),
    "aten::conv3d": (3, False, 6),
    "aten::conv_transpose1d": (1, True, 6),
    "aten::conv_transpose2d": (2, True, 6),
    "aten::conv_transpose3d": (3, True, 6),
    "aten::linear": (0, False, None),
}


def why_not_fold(bn: FrozenBatchNorm, ranks: dict[torch._C.Value, int]) -> str | None:
    """None when ``bn`` folds into the node that makes its input, else why not."""
    producer = bn.input.node()
    if producer.kind() not in PRODUCERS:
        return f"BN input comes from {producer.kind()}, not a conv or linear"
    readers = [u for u in bn.input.uses() if u.user.kind() != "aten::dim"]
    if len(readers) != 1:
        return f"{producer.kind()} output has {len(readers)} users"
    spatial, transposed, groups_at = PRODUCERS[producer.kind()]
    weight, bias = constant(producer.inputsAt(1)), constant(producer.inputsAt(2))
    if not isinstance(weight, torch.Tensor) or not (bias is None or isinstance(bias, torch.Tensor)):
        return f"{producer.kind()} weight or bias is not a constant"
    groups = 1 if groups_at is None else constant(producer.inputsAt(groups_at))
    if not isinstance(groups, int):
        return f"{producer.kind()} groups is not a constant"
    channels = weight.shape[1] * groups if transposed else weight.shape[0]
    if bn.mean.numel() != channels:
        return f"BN has {bn.mean.numel()} features, {producer.kind()} has {channels} channels"
    rank = ranks.get(bn.input)
    if rank is None:
        return "BN input rank unknown (pass example_inputs)"
    if rank != (spatial + 2 if spatial else 2):
        return f"{producer.kind()} output is {rank}-D: BN normalizes dim 1, not its channels"
    return None


def fold(graph: torch._C.Graph, bn: FrozenBatchNorm) -> None:
    """Replace the producer's weight and bias by the folded ones and remove ``bn``."""
    producer = bn.input.node()
    _, transposed, groups_at = PRODUCERS[producer.kind()]
    weight: torch.Tensor = constant(producer.inputsAt(1))
    bias = constant(producer.inputsAt(2))
    groups = 1 if groups_at is None else int(constant(producer.inputsAt(groups_at)))
    s, t = bn.scale_shift()
    new_w = scale_output_channels(weight, s, transposed=transposed, groups=groups)
    b = torch.zeros_like(s) if bias is None else bias.to(torch.float64)
    new_b = b * s + t
    g: Any = graph  # torch's stubs omit Graph.insertConstant
    with graph.insert_point_guard(producer):
        w_value = g.insertConstant(new_w)
        b_value = g.insertConstant(new_b.to(weight.dtype))
    producer.replaceInput(1, w_value)
    producer.replaceInput(2, b_value)
    bn.node.output().replaceAllUsesWith(producer.output())
    bn.node.destroy()


class FoldBatchNorm(ScriptPass):
    """Fold each ``aten::batch_norm`` into the conv, transposed conv or linear before it.

    Leaves a BN in training mode or with statistics that are not constants, one whose input is no
    producer or has other users, a producer whose weight, bias or groups is not a constant, and a
    BN whose features or input rank do not provably match the producer's output channels.
    """

    optimization = MobileOptimizerType.CONV_BN_FUSION
    summary = "batch_norm(conv / conv_transpose / linear (x)) -> producer with W', b' folded"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        """Fold every BatchNorm that follows a producer it alone reads, in every method."""
        rewrites, skips = 0, Skips()
        ranks = input_ranks(module, ctx)
        for graph, bn in batchnorms(module, ctx.methods):
            reason = bn if isinstance(bn, str) else why_not_fold(bn, ranks)
            if reason is not None:
                skips.add(reason)
                continue
            assert isinstance(bn, FrozenBatchNorm)
            with torch.no_grad():
                fold(graph, bn)
            rewrites += 1
        return PassResult(module, rewrites, dict(skips))
