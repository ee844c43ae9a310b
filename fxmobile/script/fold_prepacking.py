"""Run prepack calls whose inputs are all constant once, at optimization time.

    ctx = prepack(W, b, ...)        (all constant)
    y = run(x, ctx)          ->     y = run(x, self.<attr>)     # the context, stored once

The context object is stored as an attribute of the module, named as upstream names it
(``prepack_folding_<method>._jit_pass_packed_weight_<N>``), and read with ``prim::GetAttr``, so
no prepack op is left to run on the device. A prepack call with a non-constant input (a weight
computed from the input) is left in place and reported: it repacks on every call.
"""

from __future__ import annotations

import torch

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.script.graph_utils import NOT_CONSTANT, constant, iter_nodes
from fxmobile.script.stage import ScriptContext, ScriptPass

ATTR_PREFIX = "prepack_folding"


def fold_prepack_calls(
    module: torch.jit.ScriptModule, ctx: ScriptContext, prepack_kinds: frozenset[str]
) -> PassResult[torch.jit.ScriptModule]:
    """Fold every constant-input call of an op in ``prepack_kinds`` into a module attribute."""
    folded, skips = 0, Skips()
    for method in ctx.methods:
        graph = module._c._get_method(method).graph
        self_value = next(iter(graph.inputs()))
        base = f"{ATTR_PREFIX}_{method}._jit_pass_packed_weight_"
        uid = 0
        for node in list(iter_nodes(graph)):
            if node.kind() not in prepack_kinds:
                continue
            consts = [constant(v) for v in node.inputs()]
            if any(c is NOT_CONSTANT for c in consts):
                skips.add(f"{node.kind()} has a non-constant input (repacks on every call)")
                continue
            namespace, name = node.kind().split("::")
            packed = getattr(getattr(torch.ops, namespace), name)(*consts)
            while module._c.hasattr(f"{base}{uid}"):
                uid += 1
            attr = f"{base}{uid}"
            uid += 1
            ctx_type = node.output().type()
            module._c._register_attribute(attr, ctx_type, packed)
            with graph.insert_point_guard(node):
                get = graph.create("prim::GetAttr", [self_value], 1)
                get.s_("name", attr)
                get.output().setType(ctx_type)
                graph.insertNode(get)
            node.output().replaceAllUsesWith(get.output())
            node.destroy()
            folded += 1
    return PassResult(module, folded, dict(skips))


class FoldPrepacking(ScriptPass):
    """Fold the calls of one backend's prepack ops (``prepack_kinds``)."""

    summary = "prepack(constant W, b, ...) -> packed context attribute (prim::GetAttr)"

    def __init__(
        self, prepack_kinds: frozenset[str], optimization: MobileOptimizerType | None
    ) -> None:
        self.prepack_kinds = prepack_kinds
        self.optimization = optimization

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        """Fold every prepack call whose inputs are all constants."""
        return fold_prepack_calls(module, ctx, self.prepack_kinds)
