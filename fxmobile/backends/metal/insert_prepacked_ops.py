"""Linear and 2-D convolutions as Metal prepack + run pairs (``metal_rewrite.cpp``).

    aten::linear(x, W, b)
      -> metal_prepack::linear_run(x, metal_prepack::linear_prepack(W, b, None, None))
    aten::conv2d(x, W, b, stride, padding, dilation, groups)
      -> metal_prepack::conv2d_run(x, metal_prepack::conv2d_prepack(
             W, b, stride, padding, dilation, groups, None, None))

Unlike Vulkan's, Metal's linear context takes the weight as ``nn.Linear`` holds it,
``(out_features, in_features)``. A conv whose padding is a string ('same' / 'valid') has no
prepacked form and stays as it is, as do linears whose weight is not 2-D and convolutions whose
weight is not 4-D; each is reported.

Upstream inserts these before freezing, rewriting the graphs of its module's clone (whose types
``Module.clone`` copies). fxmobile inserts them after freezing: its copy of the module still
shares compiled types, and so method graphs, with every other scripted instance of the same
classes until the first freeze gives it types of its own, so rewriting in place before then
would change modules fxmobile does not own. Freezing first leaves the result the same: the
prepack calls then take the frozen constants directly and fold just as well.
"""

from __future__ import annotations

from typing import Any

import torch

from fxmobile.passes.infra import Skips
from fxmobile.script.graph_utils import iter_nodes
from fxmobile.script.infra import ScriptContext, ScriptPass, ScriptPassResult

# aten op -> (prepack op, run op, rank the weight must have, how many aten arguments after x
# the prepack op takes, in the same order: W, b[, stride, padding, dilation, groups])
_REWRITES: dict[str, tuple[str, str, int, int]] = {
    "aten::linear": ("metal_prepack::linear_prepack", "metal_prepack::linear_run", 2, 2),
    "aten::conv2d": ("metal_prepack::conv2d_prepack", "metal_prepack::conv2d_run", 4, 6),
}

PREPACK_KINDS = frozenset(prepack for prepack, *_ in _REWRITES.values())


def can_prepack(node: torch._C.Node) -> str | None:
    """None when ``node`` has a Metal form; otherwise the reason it has none."""
    kind = node.kind()
    inputs = list(node.inputs())
    if kind == "aten::conv2d" and not isinstance(inputs[4].type(), torch._C.ListType):
        return f"{kind} with string padding"
    weight = inputs[1]
    if weight.node().kind() == "prim::Constant":
        value = weight.toIValue()
        rank = _REWRITES[kind][2]
        if isinstance(value, torch.Tensor) and value.dim() != rank:
            return f"{kind} weight is {value.dim()}-D"
    return None


class InsertMetalOps(ScriptPass):
    optimization = None  # Metal takes no blocklist
    pass_name = "insert_metal_ops"
    summary = "aten::linear / conv2d -> metal_prepack::*_prepack + *_run"

    def call(self, module: torch.jit.ScriptModule, ctx: ScriptContext) -> ScriptPassResult:
        rewrites, skips = 0, Skips()
        for method in ctx.methods:
            graph = module._c._get_method(method).graph
            g: Any = graph  # torch's stubs omit Graph.insert's list form and insertConstant
            for node in [n for n in iter_nodes(graph) if n.kind() in _REWRITES]:
                reason = can_prepack(node)
                if reason:
                    skips.add(reason)
                    continue
                prepack_kind, run_kind, _, n_args = _REWRITES[node.kind()]
                inputs = list(node.inputs())
                with graph.insert_point_guard(node):
                    none = g.insertConstant(None)
                    packed = g.insert(prepack_kind, [*inputs[1 : 1 + n_args], none, none])
                    out = g.insert(run_kind, [inputs[0], packed])
                out.setType(node.output().type())
                node.output().replaceAllUsesWith(out)
                node.destroy()
                rewrites += 1
        return ScriptPassResult(module, rewrites, dict(skips))
