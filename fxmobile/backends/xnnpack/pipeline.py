"""The CPU (XNNPACK) pipeline, in upstream's order (``xnnpack_rewrite.cpp``), plus fixes.

conv+BN folding, freeze, conv1d -> conv2d (after freezing: see ``fxmobile.script.infra``),
then, under ``INSERT_FOLD_PREPACK_OPS``, linear recovery, prepacked ops, clamp fusion and
prepack folding; quantized conv packed params hoisted; canonical optimizations; dropout
removal; add+relu fusion. The module is marked ``mobile_optimized = True``.
"""

from __future__ import annotations

from typing import ClassVar

from fxmobile.backends.xnnpack.insert_prepacked_ops import InsertPrepackedOps
from fxmobile.options import MobileOptimizerType
from fxmobile.script.canonicalize import Canonicalize
from fxmobile.script.conv1d_to_conv2d import Conv1dToConv2d
from fxmobile.script.fold_conv_batchnorm import FoldConvBatchNorm
from fxmobile.script.fold_prepacking import FoldPrepacking
from fxmobile.script.freezing import Freeze
from fxmobile.script.fuse_add_relu import FuseAddRelu
from fxmobile.script.fuse_clamp import ClampSlots, FuseClamp
from fxmobile.script.fuse_linear import FuseLinear
from fxmobile.script.hoist_conv_packed_params import HoistConvPackedParams
from fxmobile.script.infra import ScriptPass
from fxmobile.script.remove_dropout import RemoveDropoutScript

MARKERS = {"mobile_optimized": True}


class FuseXnnpackClamp(FuseClamp):
    # upstream fuses into linear and conv2d; the transposed conv takes bounds just the same
    optimization = MobileOptimizerType.INSERT_FOLD_PREPACK_OPS
    slots: ClassVar[dict[str, ClampSlots]] = {
        "prepacked::linear_clamp_run": ClampSlots("prepacked::linear_clamp_prepack", 2, 3),
        "prepacked::conv2d_clamp_run": ClampSlots("prepacked::conv2d_clamp_prepack", 6, 7),
        "prepacked::conv2d_transpose_clamp_run": ClampSlots(
            "prepacked::conv2d_transpose_clamp_prepack", 7, 8
        ),
    }


class FoldXnnpackPrepacking(FoldPrepacking):
    optimization = MobileOptimizerType.INSERT_FOLD_PREPACK_OPS
    prepack_kinds = frozenset(slots.prepack_kind for slots in FuseXnnpackClamp.slots.values())


def passes() -> tuple[ScriptPass, ...]:
    return (
        FoldConvBatchNorm(),
        Freeze(),
        Conv1dToConv2d(),  # upstream runs it before freezing; after, it rewrites fresh types
        FuseLinear(),
        InsertPrepackedOps(),
        FuseXnnpackClamp(),
        FoldXnnpackPrepacking(),
        HoistConvPackedParams(),
        Canonicalize(),
        RemoveDropoutScript(),
        FuseAddRelu(),
    )
