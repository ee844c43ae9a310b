"""Capture: turning an eager module into a ``torch.fx.GraphModule`` without touching it."""

from fxmobile.capture.checks import admit
from fxmobile.capture.trace import Capture, capture

__all__ = ["Capture", "admit", "capture"]
