"""The order of the passes on the exported ATen graph: one tuple, in one place.

Attention first: its decomposition makes the reshapes and constants the later passes tidy.
Then LayerNorm, then the selections and shape-only views (attention's unbind of q, k and v
among them), and last the numbers of arithmetic, once every pass that adds arithmetic has run.
"""

from __future__ import annotations

from fxmobile.executorch.passes.decompose_layer_norm import DecomposeLayerNorm
from fxmobile.executorch.passes.decompose_sdpa import DecomposeSdpa
from fxmobile.executorch.passes.reshape_views import ReshapeViews
from fxmobile.executorch.passes.scalars_as_constants import ScalarsAsConstants
from fxmobile.executorch.passes.slice_selections import SliceSelections
from fxmobile.passes.stage import FxPass

EXPORT_PASSES: tuple[type[FxPass], ...] = (
    DecomposeSdpa,
    DecomposeLayerNorm,
    SliceSelections,
    ReshapeViews,
    ScalarsAsConstants,
)


def export_pipeline() -> tuple[FxPass, ...]:
    """Fresh instances of the passes on the exported graph, in order."""
    return tuple(cls() for cls in EXPORT_PASSES)
