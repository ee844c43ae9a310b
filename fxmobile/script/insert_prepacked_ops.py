"""Linear and 2-D convolutions as a backend's prepack + run pairs, from the backend's table.

    aten::linear(x, W, b)        -> run(x, prepack(W, b, None, None))
    aten::conv2d(x, W, b, stride, padding, dilation, groups)
                                 -> run(x, prepack(W, b, stride, padding, dilation, groups,
                                                   None, None))
    aten::conv_transpose2d(x, W, b, stride, padding, output_padding, groups, dilation)
                                 -> run(x, prepack(W, b, stride, padding, output_padding,
                                                   dilation, groups, None, None))

XNNPACK (``prepacked::*_clamp_prepack`` / ``*_clamp_run``, all three ops) and Metal
(``metal_prepack::*_prepack`` / ``*_run``, linear and conv2d) each give a table of ``Prepack``
entries: which aten op, which prepack and run ops, the order of the aten op's arguments in the
prepack call (the transposed conv's dilation moves before groups), and the weight's rank. The
two ``None`` are the output bounds, which clamp fusion fills in later. A conv whose padding is a
string ('same' / 'valid'), and an op whose weight has another rank, has no prepacked form and
stays as it is; each is reported.

Upstream inserts these before freezing, rewriting the graphs of its module's clone. fxmobile
inserts them after freezing: its copy of the module still shares compiled types, and so method
graphs, with every other scripted instance of the same classes until the first freeze gives it
types of its own. The prepack calls then take the frozen constants directly and fold as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.script.aliasing import why_layout_matters
from fxmobile.script.graph_utils import iter_nodes
from fxmobile.script.stage import ScriptContext, ScriptPass


@dataclass(frozen=True)
class Prepack:
    """How one aten op becomes a prepack + run pair."""

    aten: str  # "aten::conv2d"
    prepack: str  # "prepacked::conv2d_clamp_prepack"
    run: str  # "prepacked::conv2d_clamp_run"
    order: tuple[int, ...]  # positions of the aten op's arguments, in the prepack call's order
    weight_rank: int


def can_prepack(node: torch._C.Node, entry: Prepack) -> str | None:
    """None when ``node`` has a prepacked form; otherwise the reason it has none."""
    inputs = list(node.inputs())
    if entry.aten != "aten::linear" and not isinstance(inputs[4].type(), torch._C.ListType):
        return f"{entry.aten} with string padding"
    rank = _rank(inputs[1])
    if rank is not None and rank != entry.weight_rank:
        return f"{entry.aten} weight is {rank}-D"
    return None


def _rank(value: torch._C.Value) -> int | None:
    if value.node().kind() == "prim::Constant":
        constant = value.toIValue()
        return constant.dim() if isinstance(constant, torch.Tensor) else None
    kind = value.type()
    sizes = kind.sizes() if isinstance(kind, torch._C.TensorType) else None
    return None if sizes is None else len(sizes)


class InsertPrepackedOps(ScriptPass):
    """Rewrite the ops in a backend's ``Prepack`` table as that backend's prepack + run pair.

    Leaves a conv with string padding and an op whose weight has another rank, reported.
    """

    summary = "aten::linear / conv2d / conv_transpose2d -> the backend's prepack + run ops"

    def __init__(self, table: Sequence[Prepack], optimization: MobileOptimizerType | None) -> None:
        self.table = {entry.aten: entry for entry in table}
        self.optimization = optimization

    @property
    def prepack_kinds(self) -> frozenset[str]:
        """The prepack ops this pass inserts (what prepack folding folds)."""
        return frozenset(entry.prepack for entry in self.table.values())

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        """Rewrite every op in the table that has a prepacked form, in every method."""
        rewrites, skips = 0, Skips()
        for method in ctx.methods:
            graph = module._c._get_method(method).graph
            g: Any = graph  # torch's stubs omit Graph.insert's list form and insertConstant
            layout = why_layout_matters(graph)
            for node in [n for n in iter_nodes(graph) if n.kind() in self.table]:
                entry = self.table[node.kind()]
                reason = layout or can_prepack(node, entry)
                if reason:
                    skips.add(reason)
                    continue
                inputs = list(node.inputs())
                with graph.insert_point_guard(node):
                    none = g.insertConstant(None)
                    packed = g.insert(
                        entry.prepack, [*(inputs[i] for i in entry.order), none, none]
                    )
                    out = g.insert(entry.run, [inputs[0], packed])
                out.setType(node.output().type())
                node.output().replaceAllUsesWith(out)
                node.destroy()
                rewrites += 1
        return PassResult(module, rewrites, dict(skips))
