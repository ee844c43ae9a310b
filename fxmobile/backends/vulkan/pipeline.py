"""The Vulkan pipeline, in upstream's order (``vulkan_rewrite.cpp``, ``vulkanOptimizeForMobile``).

Freeze, dropout removal, canonical convolutions, linear recovery, BatchNorm folded into its conv or
linear (always), Vulkan create/run pairs, clamp fusion into conv2d, folding of the create calls,
mutation removal, the automatic GPU transfer (unless blocklisted), canonical optimizations. The
module is marked ``optimized_for_vulkan = True`` (and ``requires_backend_transfers = False`` by the
transfer).

Upstream reads one blocklist member, ``VULKAN_AUTOMATIC_GPU_TRANSFER``; every other step here runs
whatever the blocklist says. Differences from upstream, each on purpose:

- Clamp fusion runs on every rewritten method, not only ``forward``, and also takes relu6 and
  clamp (the shared ``FuseClamp``). In torch 2.15 upstream's own fusion never fires: its insert
  step already returns folded context constants, which its relu/hardtanh patterns cannot match.
- Mutation removal runs on every rewritten method (upstream: ``forward`` only).
- Dropout goes right after freezing (upstream: after folding), so a conv's activation that
  follows an eval-mode dropout fuses too.
- The GPU transfer differs in three edge cases (see ``insert_gpu_transfers``).
- Quantized ops are not rewritten (upstream's ``vulkan_quantized*``): fxmobile has no Vulkan
  quantized kernels.
"""

from __future__ import annotations

from fxmobile.backends.library import OpFamily
from fxmobile.backends.spec import BackendSpec
from fxmobile.backends.vulkan.insert_gpu_transfers import InsertGpuTransfers
from fxmobile.backends.vulkan.insert_prepacked_ops import CREATE_KINDS, InsertVulkanOps
from fxmobile.options import MobileOptimizerType
from fxmobile.script.canonicalize import Canonicalize
from fxmobile.script.canonicalize_convolutions import CanonicalizeConvolutions
from fxmobile.script.decompose_attention import DecomposeAttention
from fxmobile.script.fold_batchnorm import FoldBatchNorm
from fxmobile.script.fold_prepacking import FoldPrepacking
from fxmobile.script.freeze import Freeze
from fxmobile.script.fuse_clamp import ClampSlots, FuseClamp
from fxmobile.script.fuse_linear import FuseLinear
from fxmobile.script.remove_dropout import RemoveDropout
from fxmobile.script.remove_mutation import RemoveMutation
from fxmobile.script.stage import ScriptPass

# upstream fuses into conv2d only (create_conv2d_context's output_min, output_max)
CLAMP_SLOTS = {
    "vulkan_prepack::run_conv2d_context": ClampSlots("vulkan_prepack::create_conv2d_context", 6, 7),
}


def passes() -> tuple[ScriptPass, ...]:
    """Fresh instances of the Vulkan pipeline's passes, in order."""
    return (
        Freeze(),
        RemoveDropout(),
        CanonicalizeConvolutions(),
        DecomposeAttention(),  # only for a target runtime without the fused op
        FuseLinear(),  # upstream runs it inside its linear insertion
        FoldBatchNorm(),  # the rest runs as Vulkan's own batch_norm context
        InsertVulkanOps(),
        FuseClamp(CLAMP_SLOTS, None),  # upstream's Vulkan pipeline cannot switch it off
        FoldPrepacking(CREATE_KINDS, None),
        RemoveMutation(),
        InsertGpuTransfers(),
        Canonicalize(),
    )


SPEC = BackendSpec(
    OpFamily.VULKAN,
    passes,
    {"optimized_for_vulkan": True},
    honours=frozenset({MobileOptimizerType.VULKAN_AUTOMATIC_GPU_TRANSFER}),
)
