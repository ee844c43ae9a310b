"""The order of the passes on the exported graph: one tuple, in one place.

Constant subgraphs first: Swin's shifted-window masks and relative-position gathers become
buffers, so the attention after them has a constant mask. Then attention: its decomposition,
and hand-written attention's matmuls after it, make the batched matmuls, reshapes and constants
the later passes tidy. Then the 1-D poolings, as the 2-D ones the passes after them know. Then
what computes numbers in ops XNNPACK declines or gets wrong: LayerNorm, GroupNorm, a BatchNorm
no conv takes, 2-norms and variances (their sums and means are for the next pass), means and
sums, the tanh GELU, a softmax over an inner dim or after a conv, small integer powers, nearest
upsampling, an average pooling that counts its padding. Then the ops that only move data: rolls,
unfolds into tiles (their padding a constant pad, their slices of step 1), reflect and replicate
pads, strided slices, selections, broadcasts, layout copies and shape-only views (attention's
unbind of q, k and v among them; a no-op expand is a view, a real one a broadcast). Last the
numbers of arithmetic, once every pass that adds arithmetic has run.

No pass here makes a candidate for an earlier one: none emits a subgraph of constants only,
attention, a 1-D pooling, a norm, a variance, a reduction XNNPACK declines, a GELU, a softmax, a
power, an upsampling, a pooling that counts its padding, a roll, an unfold, a pad other than a
constant one, a strided slice, a selection, an expand or a layout copy; the later passes'
convolutions (of an upsampling, an average pooling) stand where an op stood that the softmax
pass already counted as channels-last. So one run in this order leaves nothing the pipeline
would still rewrite.
"""

from __future__ import annotations

from fxmobile.executorch.passes.avg_pool_padding_as_pad import AvgPoolPaddingAsPad
from fxmobile.executorch.passes.decompose_batchnorm import DecomposeBatchNorm
from fxmobile.executorch.passes.decompose_group_norm import DecomposeGroupNorm
from fxmobile.executorch.passes.decompose_layer_norm import DecomposeLayerNorm
from fxmobile.executorch.passes.decompose_mean import DecomposeMean
from fxmobile.executorch.passes.decompose_sdpa import DecomposeSdpa
from fxmobile.executorch.passes.decompose_tanh_gelu import DecomposeTanhGelu
from fxmobile.executorch.passes.decompose_variance import DecomposeVariance
from fxmobile.executorch.passes.decompose_vector_norm import DecomposeVectorNorm
from fxmobile.executorch.passes.fold_constant_subgraphs import FoldConstantSubgraphs
from fxmobile.executorch.passes.matmul_as_bmm import MatmulAsBmm
from fxmobile.executorch.passes.pad_as_slices import PadAsSlices
from fxmobile.executorch.passes.pool1d_as_pool2d import Pool1dAsPool2d
from fxmobile.executorch.passes.pow_as_products import PowAsProducts
from fxmobile.executorch.passes.remove_expands import RemoveExpands
from fxmobile.executorch.passes.remove_layout_copies import RemoveLayoutCopies
from fxmobile.executorch.passes.reshape_views import ReshapeViews
from fxmobile.executorch.passes.roll_as_slices import RollAsSlices
from fxmobile.executorch.passes.scalars_as_constants import ScalarsAsConstants
from fxmobile.executorch.passes.slice_selections import SliceSelections
from fxmobile.executorch.passes.softmax_over_last_dim import SoftmaxOverLastDim
from fxmobile.executorch.passes.strided_slices import StridedSlices
from fxmobile.executorch.passes.unfold_as_permute import UnfoldAsPermute
from fxmobile.executorch.passes.upsample_nearest_as_conv_transpose import (
    UpsampleNearestAsConvTranspose,
)
from fxmobile.passes.stage import FxPass

EXPORT_PASSES: tuple[type[FxPass], ...] = (
    FoldConstantSubgraphs,
    DecomposeSdpa,
    MatmulAsBmm,
    Pool1dAsPool2d,
    DecomposeLayerNorm,
    DecomposeGroupNorm,
    DecomposeBatchNorm,
    DecomposeVectorNorm,
    DecomposeVariance,
    DecomposeMean,
    DecomposeTanhGelu,
    SoftmaxOverLastDim,
    PowAsProducts,
    UpsampleNearestAsConvTranspose,
    AvgPoolPaddingAsPad,
    RollAsSlices,
    UnfoldAsPermute,
    PadAsSlices,
    StridedSlices,
    SliceSelections,
    RemoveExpands,
    RemoveLayoutCopies,
    ReshapeViews,
    ScalarsAsConstants,
)


def export_pipeline() -> tuple[FxPass, ...]:
    """Fresh instances of the passes on the exported graph, in order."""
    return tuple(cls() for cls in EXPORT_PASSES)
