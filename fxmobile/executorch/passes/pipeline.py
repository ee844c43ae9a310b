"""The order of the passes on the exported ATen graph: one tuple, in one place."""

from __future__ import annotations

from fxmobile.passes.stage import FxPass

EXPORT_PASSES: tuple[type[FxPass], ...] = ()


def export_pipeline() -> tuple[FxPass, ...]:
    """Fresh instances of the passes on the exported graph, in order."""
    return tuple(cls() for cls in EXPORT_PASSES)
