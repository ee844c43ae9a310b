"""Attention written out for a target runtime older than ``aten::scaled_dot_product_attention``.

torch 2.0 added the fused op, and ``nn.MultiheadAttention`` (torchvision's ViTs, most
transformers) calls it; PyTorch Mobile 1.13.1, what shipped apps load files with, does not have
it and refuses the whole file. With ``target_runtime`` naming such a runtime (its
``RuntimeSpec.lacks``), each call whose mask, dropout, causality and grouping are the plain
inference ones is rewritten as the math it stands for:

    softmax(q @ k.transpose(-2, -1) * scale, -1) @ v      scale = 1 / sqrt(q.size(-1)) if None

A call with a mask, causal masking, dropout or grouped heads is left, with the reason (and the
file is then refused for that runtime, naming the operator). Without such a target nothing runs:
the fused op is faster where it exists.
"""

from __future__ import annotations

from typing import Any

import torch

from fxmobile.infra import PassResult, Skips
from fxmobile.script.graph_utils import constant, iter_nodes, method_graphs
from fxmobile.script.stage import ScriptContext, ScriptPass

SDPA = "aten::scaled_dot_product_attention"


def why_not(node: torch._C.Node) -> str | None:
    """None when ``node`` (a scaled_dot_product_attention call) is plain inference attention."""
    _, _, _, mask, dropout, causal, scale, *rest = list(node.inputs())
    if constant(mask) is not None:
        return "attention with a mask is left fused"
    if constant(dropout) != 0.0:
        return "attention with dropout (or a dropout that is not a constant) is left fused"
    if constant(causal) is not False:
        return "causal attention (or causality that is not a constant) is left fused"
    if rest and constant(rest[0]) is not False:
        return "attention with grouped query heads is left fused"
    if not (constant(scale) is None or isinstance(constant(scale), float)):
        return "attention whose scale is not a constant is left fused"
    return None


def decompose(graph: torch._C.Graph, node: torch._C.Node) -> None:
    """Insert the math before ``node`` and route its users there."""
    q, k, v, _, _, _, scale_value = list(node.inputs())[:7]
    scale = constant(scale_value)
    g: Any = graph  # torch's stubs omit Graph.insert's list form and insertConstant

    def op(kind: str, *args: Any) -> torch._C.Value:
        values = [a if isinstance(a, torch._C.Value) else g.insertConstant(a) for a in args]
        return g.insert(kind, values)

    with graph.insert_point_guard(node):
        scores = op("aten::matmul", q, op("aten::transpose", k, -2, -1))
        if scale is None:
            scores = op("aten::div", scores, op("aten::sqrt", op("aten::size", q, -1)))
        else:
            scores = op("aten::mul", scores, scale)
        out = op("aten::matmul", op("aten::softmax", scores, -1), v)
    out.setType(node.output().type())
    node.output().replaceAllUsesWith(out)
    node.destroy()


class DecomposeAttention(ScriptPass):
    """For a target runtime without ``scaled_dot_product_attention``: its plain inference calls
    written out as matmul, softmax and matmul; masked, causal, dropout and grouped calls left."""

    summary = (
        "scaled_dot_product_attention -> softmax(q @ kᵀ * scale) @ v, for a runtime without it"
    )

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        """Rewrite every call in every method, when the target runtime lacks the op."""
        if SDPA not in ctx.missing_ops:
            return PassResult(module, 0, {})
        rewrites, skips = 0, Skips()
        for graph in method_graphs(module, ctx.methods):
            for node in list(iter_nodes(graph)):
                if node.kind() != SDPA:
                    continue
                reason = why_not(node)
                if reason is not None:
                    skips.add(reason)
                    continue
                decompose(graph, node)
                rewrites += 1
        return PassResult(module, rewrites, dict(skips))
