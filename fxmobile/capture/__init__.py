"""Capture: turning an eager module into a ``torch.fx.GraphModule`` without touching it."""

from fxmobile.capture.trace import (
    Capture,
    capture,
    check_module,
    require_eval,
    training_submodules,
)

__all__ = ["Capture", "capture", "check_module", "require_eval", "training_submodules"]
