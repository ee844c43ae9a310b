"""In-place tensor ops as their functional forms, where no alias can tell the difference.

    y = aten::relu_(x)     ->  y = aten::relu(x)        (x not used afterwards, not an alias)
    aten::add_(x, b)       ->  x' = aten::add(x, b)     (later uses of x read x')

GPU runtimes (Vulkan, Metal) keep tensors in textures and run functional kernels; upstream runs
torch's ``RemoveTensorMutation`` on ``forward`` in both pipelines, here on every rewritten method.
The count is the number of mutating nodes that went; a mutation torch's pass cannot prove safe
(its input is a graph input, an alias of one, or read again later through an alias) stays, and is
reported under its op.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import cache

import torch

from fxmobile.infra import PassResult
from fxmobile.script.graph_utils import iter_nodes, method_graphs
from fxmobile.script.jit_passes import jit
from fxmobile.script.stage import ScriptContext, ScriptPass


@cache
def _writes(schema: str) -> bool:
    """Whether an operator with this schema writes to one of its arguments."""
    if schema == "(no schema)":
        return False
    try:
        parsed = torch._C.parse_schema(schema)
    except RuntimeError:
        return False
    return any(a.alias_info is not None and a.alias_info.is_write for a in parsed.arguments)


def mutating_kinds(module: torch.jit.ScriptModule, methods: Sequence[str]) -> Counter[str]:
    """Nodes that write to a tensor argument, by kind, across ``methods``."""
    counts: Counter[str] = Counter()
    for graph in method_graphs(module, methods):
        for node in iter_nodes(graph):
            if node.kind().startswith("aten::") and _writes(node.schema()):
                counts[node.kind()] += 1
    return counts


class RemoveMutation(ScriptPass):
    """Rewrite in-place ops as their functional forms where torch proves no alias sees the write.

    Leaves, by op, a write to a graph input or an alias of one, or to a value an alias reads later.
    """

    optimization = None  # upstream's GPU pipelines cannot switch it off
    summary = "aten::relu_ / add_ / ... -> aten::relu / add / ... where no alias observes it"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        before = mutating_kinds(module, ctx.methods)
        for graph in method_graphs(module, ctx.methods):
            jit._jit_pass_remove_mutation(graph)
        after = mutating_kinds(module, ctx.methods)
        skips = {
            f"{kind} kept: torch cannot prove no alias observes the write": n
            for kind, n in after.items()
        }
        return PassResult(module, max(before.total() - after.total(), 0), skips)
