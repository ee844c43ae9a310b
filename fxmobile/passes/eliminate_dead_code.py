"""Dead code elimination: nodes whose results nobody uses, and the attributes they read.

    t = f(x)   # t unused, f pure   ->   (nothing)

Unlike ``torch.fx.Graph.eliminate_dead_code`` this keeps anything that may mutate: in-place
methods and functions (``relu_``, ``inplace=True``), in-place modules and modules from outside
``torch.nn`` (see ``graph_utils.is_pure``). Submodules, parameters and buffers no node refers to
any more are dropped too, so the module's size shrinks with the graph.
"""

from __future__ import annotations

from typing import ClassVar

from torch import fx

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.graph_utils import erase_unused_attributes, is_pure
from fxmobile.passes.stage import FxContext, FxPass


class EliminateDeadCode(FxPass):
    """Erase unused pure nodes, then the submodules, parameters and buffers nothing reads any more.

    Keeps an unused node that may mutate: an in-place op, a module from outside ``torch.nn``.
    """

    optimization = MobileOptimizerType.ELIMINATE_DEAD_CODE
    summary: ClassVar[str] = "unused pure nodes, submodules and tensors -> removed"

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        # Walk backwards so a chain of dead nodes goes in one sweep.
        for node in reversed(list(gm.graph.nodes)):
            if node.users or node.op in ("placeholder", "output"):
                continue
            if is_pure(gm, node):
                gm.graph.erase_node(node)
                rewrites += 1
            else:
                skips.add(f"unused result of {node.op} may have side effects")
        rewrites += erase_unused_attributes(gm)
        return PassResult(gm, rewrites, dict(skips))
