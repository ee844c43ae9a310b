"""The default order of the FX passes: one tuple, in one place.

Removals first (so folding sees producers and their consumers directly), with dead code (a value
the model computes and never uses is still a consumer, and a producer with two consumers does
not fold), then constant folding (a weight computed from parameters becomes a plain attribute
that later folds can use), then BatchNorm folding into producers; a BatchNorm that could not
fold becomes ``x * s + t``, which constant-arithmetic folding can still push into a producer (a
Linear followed by BatchNorm1d ends up fully folded); dead code again after that (what the folds
left unused). Channels-last runs after everything that rewrites weights (on for the CPU backend
of ``optimize``, opt-in elsewhere), and when the graph is to be scripted, leaf-module inlining
comes last.
"""

from __future__ import annotations

from fxmobile.passes.decompose_batchnorm import DecomposeBatchNorm
from fxmobile.passes.eliminate_dead_code import EliminateDeadCode
from fxmobile.passes.fold_batchnorm import FoldBatchNorm
from fxmobile.passes.fold_constants import FoldConstants
from fxmobile.passes.fold_conv_arithmetic import FoldConvArithmetic
from fxmobile.passes.inline_modules import InlineModules
from fxmobile.passes.remove_dropout import RemoveDropout
from fxmobile.passes.remove_identity import RemoveIdentity
from fxmobile.passes.stage import FxPass
from fxmobile.passes.to_channels_last import ToChannelsLast

DEFAULT_FX_PASSES: tuple[type[FxPass], ...] = (
    RemoveDropout,
    RemoveIdentity,
    EliminateDeadCode,
    FoldConstants,
    FoldBatchNorm,
    DecomposeBatchNorm,
    FoldConvArithmetic,
    EliminateDeadCode,
)


def fx_pipeline(*, channels_last: bool, for_script: bool) -> tuple[FxPass, ...]:
    """Fresh instances of the default passes, plus channels-last and inlining (for the
    TorchScript stage) when asked for: every caller says which."""
    passes: list[FxPass] = [cls() for cls in DEFAULT_FX_PASSES]
    if channels_last:
        passes.append(ToChannelsLast())
    if for_script:
        passes.append(InlineModules())
    return tuple(passes)
