"""Add followed by ReLU as one kernel.

relu(add(a, b, alpha))    -> _add_relu(a, b, alpha)
relu_(add(a, b, alpha))   -> _add_relu(a, b, alpha)
relu_(add_(a, b, alpha))  -> _add_relu_(a, b, alpha)

torch's rewrite places the fused node without regard to aliasing, and ``_add_relu`` clamps in
its first operand's dtype: a method where that could change a result is left alone, with the
reason (``why_not_fuse``; aliasing is traced through views by ``fxmobile.script.aliasing``).
The resnet pattern ``relu_(out += identity)`` writes only a tensor nothing else reads and
still fuses.
"""

from __future__ import annotations

import torch

from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.script.aliasing import root, written_roots
from fxmobile.script.graph_utils import count_kinds, iter_nodes, method_graphs
from fxmobile.script.jit_passes import jit
from fxmobile.script.stage import ScriptContext, ScriptPass

ALIASED = "method left alone: an add reads memory that another op writes in place"
READ_ELSEWHERE = "method left alone: an add_ writes a tensor that another op reads"
MIXED_DTYPES = "method left alone: an add's first operand is a constant or of another dtype"
_FUSED = {"aten::_add_relu", "aten::_add_relu_"}
_ADDS = ("aten::add", "aten::add_")


class FuseAddRelu(ScriptPass):
    optimization = MobileOptimizerType.FUSE_ADD_RELU
    summary = "add (+ relu / relu_) -> aten::_add_relu"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        before = count_kinds(module, ctx.methods, _FUSED)
        skips: dict[str, int] = {}
        for graph in method_graphs(module, ctx.methods):
            reason = why_not_fuse(graph)
            if reason:
                skips[reason] = skips.get(reason, 0) + 1
            else:
                jit._jit_pass_fuse_add_relu(graph)
        fused = count_kinds(module, ctx.methods, _FUSED) - before
        return PassResult(module, fused, skips)


def why_not_fuse(graph: torch._C.Graph) -> str | None:
    """Why torch's rewrite may not run on ``graph``, or None when every add in it is safe.

    The rewrite places the fused node right after its last input is defined, which can be
    before other ops that write or read the add's operands (it moved ``_add_relu_(x, c)``
    above a ``relu(x)`` that had read ``x`` before the ``add_``: found by the fuzzer). And
    ``_add_relu`` clamps in its first operand's dtype: a float64 0-dim first operand of a
    float32 add fails with "value cannot be converted to type float without overflow", an
    integer one would clamp at its maximum.
    """
    nodes = list(iter_nodes(graph))
    adds = [n for n in nodes if n.kind() in _ADDS]
    if not adds:
        return None
    written = written_roots(graph)

    def mixed(node: torch._C.Node) -> bool:
        a, b = list(node.inputs())[:2]
        return a.node().kind() == "prim::Constant" or _dtypes_differ(a, b)

    def own_write(node: torch._C.Node) -> torch._C.Value | None:
        """add_ writes its own first input: that write is the pattern's, not another op's."""
        return root(node.inputsAt(0)) if node.kind() == "aten::add_" else None

    def aliased(node: torch._C.Node) -> bool:
        others = written - {own_write(node)}
        return any(root(v) in others for v in list(node.inputs())[:2])

    readers: dict[torch._C.Value, list[torch._C.Node]] = {}  # root -> nodes reading it
    for other in nodes:
        for v in other.inputs():
            readers.setdefault(root(v), []).append(other)

    def read_elsewhere(node: torch._C.Node) -> bool:
        own = own_write(node)
        return own is not None and any(other is not node for other in readers.get(own, []))

    for check, reason in (
        (mixed, MIXED_DTYPES),
        (aliased, ALIASED),
        (read_elsewhere, READ_ELSEWHERE),
    ):
        if any(check(node) for node in adds):
            return reason
    return None


def _dtypes_differ(a: torch._C.Value, b: torch._C.Value) -> bool:
    """Both are tensors whose dtypes the graph knows, and they differ."""
    types = [v.type() for v in (a, b)]
    dtypes = [t.scalarType() if isinstance(t, torch._C.TensorType) else None for t in types]
    return None not in dtypes and dtypes[0] != dtypes[1]
