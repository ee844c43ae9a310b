"""Remove dropout, which is the identity at inference.

    y = Dropout(p)(x)               ->  y = x     (module in eval mode)
    y = F.dropout(x, p, training=False) ->  y = x

Every dropout module kind is covered (``Dropout``, ``Dropout1d/2d/3d``, ``AlphaDropout``,
``FeatureAlphaDropout``) and the functional forms (``F.dropout*``, ``F.alpha_dropout``,
``F.feature_alpha_dropout``, ``torch.dropout`` and friends). A functional call is removed only
when its ``training`` argument is the constant False: ``F.dropout(x, p)`` defaults to
``training=True`` and really drops in eval mode too, so it is left alone and reported.

    y = F.dropout(x, p=0, training=True)  ->  y = x     (any dropout with p == 0)

With ``p == 0`` every dropout returns its input itself, in training mode too: an in-place op
on ``y`` writes ``x``. TorchScript's schema says dropout returns a fresh tensor, so a dropout
left in the graph made freezing drop ``relu_(y)`` as dead code and the write to ``x`` with it
(found by the fuzzer); removed here, the write stays visible to every later pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.graph_utils import erase_unused_attributes, module_of, replace_node
from fxmobile.passes.matchers import why_customized
from fxmobile.passes.stage import FxContext, FxPass

DROPOUT_MODULES: tuple[type[nn.Module], ...] = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)

# function -> (position of the `training` argument, its keyword, its default)
DROPOUT_FUNCTIONS: dict[Callable[..., Any], tuple[int, str, bool]] = {
    F.dropout: (2, "training", True),
    F.dropout1d: (2, "training", True),
    F.dropout2d: (2, "training", True),
    F.dropout3d: (2, "training", True),
    F.alpha_dropout: (2, "training", False),
    F.feature_alpha_dropout: (2, "training", False),
    torch.dropout: (2, "train", True),
    torch.alpha_dropout: (2, "train", True),
    torch.feature_dropout: (2, "train", True),
    torch.feature_alpha_dropout: (2, "train", True),
}


def _training_arg(node: fx.Node, position: int, keyword: str, default: bool) -> Any:
    if len(node.args) > position:
        return node.args[position]
    return node.kwargs.get(keyword, default)


def _overrides_forward(module: nn.Module) -> str | None:
    """Why a subclass of a dropout module is no dropout: its class replaces ``forward`` (it is
    in the graph as a module call when torch.fx could not trace into it), or None."""
    for base in DROPOUT_MODULES:
        if isinstance(module, base) and type(module).forward is not base.forward:
            return f"{type(module).__name__} overrides {base.__name__}.forward"
    return None


def _never_drops(p: Any) -> bool:
    """``p`` is the constant 0 (every dropout function takes ``p`` second, default 0.5)."""
    return isinstance(p, int | float) and not isinstance(p, bool) and p == 0


class RemoveDropout(FxPass):
    """Remove every dropout that is the identity (eval mode, ``training=False`` or ``p == 0``).

    Leaves one that may drop: a module in training mode, a functional call whose ``training`` is
    not the constant False; and a module that may do more: one with hooks, or of a subclass
    that overrides ``forward``.
    """

    optimization = MobileOptimizerType.REMOVE_DROPOUT
    summary: ClassVar[str] = "Dropout*(x) / F.dropout*(x, training=False) / p=0 -> x"
    keeps_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            if node.op == "call_module":
                module = module_of(gm, node)
                if not isinstance(module, DROPOUT_MODULES):
                    continue
                if module.training and not _never_drops(module.p):
                    skips.add("dropout module in training mode")
                    continue
                customized = why_customized(module) or _overrides_forward(module)
                if customized:
                    skips.add(customized)
                    continue
            elif node.op == "call_function" and node.target in DROPOUT_FUNCTIONS:
                training = _training_arg(node, *DROPOUT_FUNCTIONS[node.target])
                p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
                if training is not False and not _never_drops(p):
                    skips.add("functional dropout with training not constant False")
                    continue
            else:
                continue
            source = node.args[0] if node.args else node.kwargs.get("input")
            if not isinstance(source, fx.Node):
                skips.add("dropout input is not a tensor node")
                continue
            replace_node(node, source)
            rewrites += 1
        if rewrites:
            erase_unused_attributes(gm)
        return PassResult(gm, rewrites, dict(skips))
