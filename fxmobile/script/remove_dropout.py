"""Dropout removal on the TorchScript graph (for scripted input; eager input loses it in FX).

    dropout(x, p, train=False) -> x     (dropout, feature_dropout, alpha_dropout,
    dropout(x, 0.0, train)     -> x      feature_alpha_dropout, and their in-place forms)

ATen returns ``x`` itself for all of them when ``train`` is False or ``p`` is 0. Calls whose
``train`` argument is the constant False are removed in ``forward``, as upstream's
``_jit_pass_remove_dropout`` does for dropout and feature_dropout (the alpha forms too here),
and calls whose ``p`` is the constant 0 in every rewritten method (``F.dropout(x, p=0)``
traced keeps ``train=True``: torch.jit.trace records the default). Any other dropout is left
and reported.
"""

from __future__ import annotations

import torch

from fxmobile.infra import Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.script.graph_utils import iter_nodes, method_graphs
from fxmobile.script.stage import CountingScriptPass, ScriptContext

DROPOUT_KINDS = frozenset(
    f"aten::{kind}{suffix}"
    for kind in ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")
    for suffix in ("", "_")
)


class RemoveDropout(CountingScriptPass):
    """Remove ``aten::dropout`` / ``feature_dropout`` (and in-place forms) whose ``train`` is the
    constant False, in ``forward``; report the rest.
    """

    optimization = MobileOptimizerType.REMOVE_DROPOUT
    summary = "aten::dropout / feature_dropout / alpha forms (train=False, or p=0) -> x"
    removed = DROPOUT_KINDS

    def rewrite(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> tuple[torch.jit.ScriptModule, dict[str, int]]:
        """Every removable call in every rewritten method; what is left is reported."""
        skips = Skips()
        for name, graph in zip(ctx.methods, method_graphs(module, ctx.methods), strict=True):
            for node in remove_identity_dropouts(graph, in_forward=name == "forward"):
                skips.add(
                    f"{node.kind()} with p not 0 and train not the constant False, or train "
                    f"False outside forward"
                )
        return module, dict(skips)


def remove_identity_dropouts(graph: torch._C.Graph, in_forward: bool = True) -> list[torch._C.Node]:
    """Remove from ``graph`` every dropout call that returns its input (``_returns_its_input``);
    the dropout calls left."""
    kept = []
    for node in list(iter_nodes(graph)):
        if node.kind() not in DROPOUT_KINDS:
            continue
        if _returns_its_input(node, in_forward):
            node.output().replaceAllUsesWith(node.inputsAt(0))
            node.destroy()
        else:
            kept.append(node)
    return kept


def _returns_its_input(node: torch._C.Node, in_forward: bool) -> bool:
    """A dropout call whose ``p`` is the constant 0, or, in ``forward``, whose ``train`` is the
    constant False (toIValue: a constant's value, None for anything else)."""
    return _p_is_zero(node) or (in_forward and node.inputsAt(2).toIValue() is False)


def _p_is_zero(node: torch._C.Node) -> bool:
    p = node.inputsAt(1).toIValue()
    return isinstance(p, float | int) and not isinstance(p, bool) and p == 0
