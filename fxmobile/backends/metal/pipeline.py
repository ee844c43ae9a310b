"""The Metal pipeline, in upstream's order (``metal_rewrite.cpp``, ``metalOptimizeForMobile``),
except that the prepacked ops go in after freezing (see ``insert_prepacked_ops``).

Freeze, dropout removal, canonical convolutions, linear recovery, BatchNorm folded and the rest
decomposed, Metal prepack/run pairs, relu/hardtanh (and relu6, clamp) fusion into linear and conv2d,
prepack folding, mutation removal, canonical optimizations. The module is marked
``optimized_for_metal = True``. Metal takes no blocklist: every step always runs.

Differences from upstream, each on purpose: the prepacked ops go in after freezing; clamp
fusion, mutation removal and canonical optimizations run on every rewritten method (upstream:
``forward`` only); dropout goes right after freezing (upstream: after folding), so an activation
that follows an eval-mode dropout fuses too.
"""

from __future__ import annotations

from fxmobile.backends.library import OpFamily
from fxmobile.backends.spec import BackendSpec
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
from fxmobile.script.remove_dropout import RemoveDropout
from fxmobile.script.remove_mutation import RemoveMutation
from fxmobile.script.stage import ScriptPass

# Unlike Vulkan's, Metal's linear context takes the weight as nn.Linear holds it,
# (out_features, in_features).
PREPACK = (
    Prepack("aten::linear", "metal_prepack::linear_prepack", "metal_prepack::linear_run",
            (1, 2), 2),
    Prepack("aten::conv2d", "metal_prepack::conv2d_prepack", "metal_prepack::conv2d_run",
            (1, 2, 3, 4, 5, 6), 4),
)  # fmt: skip


def passes() -> tuple[ScriptPass, ...]:
    """Fresh instances of the Metal pipeline's passes, in order (none can be blocklisted)."""
    insert = InsertPrepackedOps(PREPACK, None)
    return (
        Freeze(),
        RemoveDropout(),
        CanonicalizeConvolutions(),
        DecomposeAttention(),  # only for a target runtime without the fused op
        FuseLinear(),  # upstream runs it inside its linear insertion
        FoldBatchNorm(),
        DecomposeBatchNorm(),
        insert,
        FuseClamp(clamp_slots(PREPACK), None),
        FoldPrepacking(insert.prepack_kinds, None),
        RemoveMutation(),
        Canonicalize(),
    )


SPEC = BackendSpec(OpFamily.METAL, passes, {"optimized_for_metal": True}, honours=frozenset())
