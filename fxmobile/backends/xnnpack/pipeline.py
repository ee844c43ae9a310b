"""The CPU (XNNPACK) pipeline, in upstream's order (``xnnpack_rewrite.cpp``), plus fixes.

Freeze; convolutions in canonical form; linear recovery; BatchNorm folded into its conv or
linear and the rest decomposed (upstream folds conv+BN on the module before freezing: fxmobile
folds on the frozen graph, which also sees traced graphs, transposed convs, linears and
BatchNorms in other modules); conv1d -> conv2d (after freezing: scripted modules share compiled
types until freezing gives them their own); then, under ``INSERT_FOLD_PREPACK_OPS``, prepacked
ops, clamp fusion and prepack folding; quantized conv packed params hoisted; canonical
optimizations; dropout removal; add+relu fusion. The module is marked ``mobile_optimized = True``.
"""

from __future__ import annotations

from fxmobile.backends.library import OpFamily
from fxmobile.backends.spec import BackendSpec
from fxmobile.backends.xnnpack.conv1d_to_conv2d import Conv1dToConv2d
from fxmobile.backends.xnnpack.fuse_add_relu import FuseAddRelu
from fxmobile.backends.xnnpack.hoist_conv_packed_params import HoistConvPackedParams
from fxmobile.options import MobileOptimizerType
from fxmobile.script.canonicalize import Canonicalize
from fxmobile.script.canonicalize_convolutions import CanonicalizeConvolutions
from fxmobile.script.decompose_attention import DecomposeAttention
from fxmobile.script.decompose_batchnorm import DecomposeBatchNorm
from fxmobile.script.fold_batchnorm import FoldBatchNorm
from fxmobile.script.fold_prepacking import FoldPrepacking
from fxmobile.script.freeze import Freeze
from fxmobile.script.fuse_clamp import FuseClamp, clamp_slots
from fxmobile.script.fuse_linear import FuseLinear
from fxmobile.script.insert_prepacked_ops import InsertPrepackedOps, Prepack
from fxmobile.script.keep_channels_last_shuffle import KeepChannelsLastShuffle
from fxmobile.script.make_inputs_channels_last import MakeInputsChannelsLast
from fxmobile.script.remove_dropout import RemoveDropout
from fxmobile.script.stage import ScriptPass
from fxmobile.script.use_inplace_ops import UseInplaceOps

PREPACK = (
    Prepack("aten::linear", "prepacked::linear_clamp_prepack", "prepacked::linear_clamp_run",
            (1, 2), 2),
    Prepack("aten::conv2d", "prepacked::conv2d_clamp_prepack", "prepacked::conv2d_clamp_run",
            (1, 2, 3, 4, 5, 6), 4),
    # the transposed conv's prepack op takes dilation before groups
    Prepack("aten::conv_transpose2d", "prepacked::conv2d_transpose_clamp_prepack",
            "prepacked::conv2d_transpose_clamp_run", (1, 2, 3, 4, 5, 7, 6), 4),
)  # fmt: skip


def passes() -> tuple[ScriptPass, ...]:
    """Fresh instances of the CPU pipeline's passes, in order."""
    prepack = MobileOptimizerType.INSERT_FOLD_PREPACK_OPS
    insert = InsertPrepackedOps(PREPACK, prepack)
    return (
        Freeze(),
        CanonicalizeConvolutions(),  # traced graphs' _convolution, string padding
        DecomposeAttention(),  # only for a target runtime without the fused op
        # before the clamp fusion, which cannot see through a dropout (upstream removes it
        # after, so a traced conv -> dropout(p=0) -> relu kept its relu unfused)
        RemoveDropout(),
        FuseLinear(),
        FoldBatchNorm(),  # every BatchNorm after a conv or linear, on every route
        DecomposeBatchNorm(),  # and every other one: none reaches the mobile graph
        Conv1dToConv2d(),  # upstream runs it before freezing; after, it rewrites fresh types
        insert,
        # upstream fuses into linear and conv2d; the transposed conv takes bounds just the same
        FuseClamp(clamp_slots(PREPACK), prepack),
        FoldPrepacking(insert.prepack_kinds, prepack),
        HoistConvPackedParams(),
        Canonicalize(),
        FuseAddRelu(),
        # the FX stage's layout, for the routes that skip it (ScriptModule input, fallbacks)
        MakeInputsChannelsLast(),
        KeepChannelsLastShuffle(),  # ShuffleNet's channel shuffle stays channels-last
        UseInplaceOps(),  # results stay in the prepacked ops' buffers: no copy before a conv
    )


SPEC = BackendSpec(OpFamily.XNNPACK, passes, {"mobile_optimized": True})
