"""Decompose a BatchNorm that could not fold into a per-channel multiply-add, in the frozen graph.

    y = batch_norm(x, mean, var, gamma, beta, training=False, eps)  ->  y = x * s + t
    s = gamma / sqrt(var + eps),  t = beta - mean * s    (float64, then the statistics' dtype)

``s`` and ``t`` are constants shaped ``[C, 1, ..., 1]`` (``rank - 2`` ones) to broadcast over dim
1; when the input's rank is unknown the form that is right for every rank is emitted,
``(x.unsqueeze(-1).flatten(2) * s + t).view_as(x)`` with ``[C, 1]`` constants, as the FX stage's
``decompose_batchnorm`` does. With ``fold_batchnorm`` before it, no ``aten::batch_norm`` with
constant statistics reaches a mobile graph on any route. A BN whose statistics are not constants
or that is in training mode is left, with the reason.
"""

from __future__ import annotations

from typing import Any

import torch

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.script.batchnorm import FrozenBatchNorm, batchnorms, input_ranks
from fxmobile.script.stage import ScriptContext, ScriptPass


def decompose(graph: torch._C.Graph, bn: FrozenBatchNorm, rank: int | None) -> None:
    """Insert ``x * s + t`` before ``bn`` and route its users there."""
    s, t = bn.scale_shift()
    dtype = bn.mean.dtype
    shape = (-1, *[1] * ((rank if rank is not None else 3) - 2))
    g: Any = graph  # torch's stubs omit Graph.insert's list form and insertConstant
    node = bn.node
    with graph.insert_point_guard(node):
        scale = g.insertConstant(s.reshape(shape).to(dtype))
        shift = g.insertConstant(t.reshape(shape).to(dtype))
        minus_one, two = g.insertConstant(-1), g.insertConstant(2)
        x = bn.input
        if rank is None:
            x = g.insert("aten::unsqueeze", [x, minus_one])
            x = g.insert("aten::flatten", [x, two, minus_one])
        # no alpha argument: it is keyword-only in add.Tensor, and a third positional
        # argument would select add.Scalar, which takes the shift as a number
        y = g.insert("aten::add", [g.insert("aten::mul", [x, scale]), shift])
        if rank is None:
            y = g.insert("aten::view_as", [y, bn.input])
    y.setType(node.output().type())
    node.output().replaceAllUsesWith(y)
    node.destroy()


class DecomposeBatchNorm(ScriptPass):
    """Turn each ``aten::batch_norm`` still in the frozen graph into ``x * s + t``.

    Leaves a BN in training mode or whose statistics are not constants, with the reason.
    """

    optimization = MobileOptimizerType.DECOMPOSE_BATCHNORM
    summary = "batch_norm(x) (not folded) -> x * s + t"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        """Decompose every inference BatchNorm with constant statistics, in every method."""
        rewrites, skips = 0, Skips()
        ranks = input_ranks(module, ctx)
        for graph, bn in batchnorms(module, ctx.methods):
            if isinstance(bn, str):
                skips.add(bn)
                continue
            decompose(graph, bn, ranks.get(bn.input))
            rewrites += 1
        return PassResult(module, rewrites, dict(skips))
