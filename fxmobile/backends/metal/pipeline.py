"""The Metal pipeline, in upstream's order (``metal_rewrite.cpp``, ``metalOptimizeForMobile``),
except that the prepacked ops go in after freezing (see ``insert_prepacked_ops``).

conv+BN folding, freeze, dropout removal, linear recovery, Metal prepack/run pairs,
relu/hardtanh (and relu6, clamp) fusion into linear and conv2d, prepack folding, mutation
removal, canonical optimizations. The module is marked ``optimized_for_metal = True``. Metal
takes no blocklist: every step always runs.

Differences from upstream, each on purpose: the prepacked ops go in after freezing; clamp
fusion, mutation removal and canonical optimizations run on every rewritten method (upstream:
``forward`` only); dropout goes right after freezing (upstream: after folding), so an activation
that follows an eval-mode dropout fuses too.
"""

from __future__ import annotations

from typing import ClassVar

from fxmobile.backends.metal.insert_prepacked_ops import PREPACK_KINDS, InsertMetalOps
from fxmobile.options import MobileOptimizerType
from fxmobile.script.canonicalize import Canonicalize
from fxmobile.script.fold_conv_batchnorm import FoldConvBatchNorm
from fxmobile.script.fold_prepacking import FoldPrepacking
from fxmobile.script.freezing import Freeze
from fxmobile.script.fuse_clamp import ClampSlots, FuseClamp
from fxmobile.script.fuse_linear import FuseLinear
from fxmobile.script.infra import ScriptPass
from fxmobile.script.remove_dropout import RemoveDropoutScript
from fxmobile.script.remove_mutation import RemoveMutation

MARKERS = {"optimized_for_metal": True}
HONOURS: frozenset[MobileOptimizerType] = frozenset()


class FuseMetalClamp(FuseClamp):
    optimization = None
    slots: ClassVar[dict[str, ClampSlots]] = {
        "metal_prepack::linear_run": ClampSlots("metal_prepack::linear_prepack", 2, 3),
        "metal_prepack::conv2d_run": ClampSlots("metal_prepack::conv2d_prepack", 6, 7),
    }


class FoldMetalPrepacking(FoldPrepacking):
    optimization = None
    prepack_kinds = PREPACK_KINDS


def passes() -> tuple[ScriptPass, ...]:
    return (
        FoldConvBatchNorm(),
        Freeze(),
        RemoveDropoutScript(),
        FuseLinear(),  # upstream runs it inside its linear insertion
        InsertMetalOps(),
        FuseMetalClamp(),
        FoldMetalPrepacking(),
        RemoveMutation(),
        Canonicalize(),
    )
