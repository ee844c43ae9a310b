"""Linear and 2-D convolutions as XNNPACK prepack + run pairs.

    aten::linear(x, W, b)
      -> prepacked::linear_clamp_run(x, prepacked::linear_clamp_prepack(W, b, None, None))
    aten::conv2d(x, W, b, stride, padding, dilation, groups)
      -> prepacked::conv2d_clamp_run(x, prepacked::conv2d_clamp_prepack(
             W, b, stride, padding, dilation, groups, None, None))
    aten::conv_transpose2d(x, W, b, stride, padding, output_padding, groups, dilation)
      -> prepacked::conv2d_transpose_clamp_run(x, prepacked::conv2d_transpose_clamp_prepack(
             W, b, stride, padding, output_padding, dilation, groups, None, None))

Note the transposed conv's argument order changes (dilation moves before groups). A conv whose
padding is a string ('same' / 'valid') has no prepacked form and stays as it is, as do linears
whose weight is not 2-D and convolutions whose weight is not 4-D.
"""

from __future__ import annotations

import torch

from fxmobile.options import MobileOptimizerType
from fxmobile.passes.infra import Skips
from fxmobile.script.graph_utils import iter_nodes
from fxmobile.script.infra import ScriptContext, ScriptPass, ScriptPassResult

# aten op -> (prepack op, run op, order of the aten op's arguments 1.. in the prepack call)
_REWRITES: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "aten::linear": ("prepacked::linear_clamp_prepack", "prepacked::linear_clamp_run", (1, 2)),
    "aten::conv2d": (
        "prepacked::conv2d_clamp_prepack",
        "prepacked::conv2d_clamp_run",
        (1, 2, 3, 4, 5, 6),
    ),
    "aten::conv_transpose2d": (
        "prepacked::conv2d_transpose_clamp_prepack",
        "prepacked::conv2d_transpose_clamp_run",
        (1, 2, 3, 4, 5, 7, 6),
    ),
}
_WEIGHT_RANK = {"aten::linear": 2, "aten::conv2d": 4, "aten::conv_transpose2d": 4}


def can_prepack(node: torch._C.Node) -> str | None:
    """None when ``node`` has a prepacked form; otherwise the reason it has none."""
    kind = node.kind()
    inputs = list(node.inputs())
    if kind != "aten::linear" and not isinstance(inputs[4].type(), torch._C.ListType):
        return f"{kind} with string padding"
    weight_type = inputs[1].type()
    sizes = weight_type.sizes() if isinstance(weight_type, torch._C.TensorType) else None
    if sizes is not None and len(sizes) != _WEIGHT_RANK[kind]:
        return f"{kind} weight is {len(sizes)}-D"
    return None


class InsertPrepackedOps(ScriptPass):
    optimization = MobileOptimizerType.INSERT_FOLD_PREPACK_OPS
    pass_name = "insert_prepacked_ops"
    summary = "aten::linear / conv2d / conv_transpose2d -> prepacked::*_clamp_prepack + run"

    def call(self, module: torch.jit.ScriptModule, ctx: ScriptContext) -> ScriptPassResult:
        rewrites, skips = 0, Skips()
        for method in ctx.methods:
            graph = module._c._get_method(method).graph
            for node in list(iter_nodes(graph)):
                if node.kind() not in _REWRITES:
                    continue
                reason = can_prepack(node)
                if reason:
                    skips.add(reason)
                    continue
                prepack_kind, run_kind, order = _REWRITES[node.kind()]
                inputs = list(node.inputs())
                with graph.insert_point_guard(node):
                    none = graph.insertConstant(None)
                    packed = graph.insert(prepack_kind, [*(inputs[i] for i in order), none, none])
                    out = graph.insert(run_kind, [inputs[0], packed])
                out.setType(node.output().type())
                node.output().replaceAllUsesWith(out)
                node.destroy()
                rewrites += 1
        return ScriptPassResult(module, rewrites, dict(skips))
