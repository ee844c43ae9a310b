"""fxmobile: eager PyTorch model in, optimized TorchScript for mobile runtimes out.

Importing fxmobile never loads its C++ operator library; that happens on first use of a backend.
"""

from fxmobile.api import FxResult, optimize_fx
from fxmobile.errors import (
    CaptureError,
    FxMobileError,
    InvalidArgumentError,
    InvalidValueError,
    NumericsError,
    PassError,
    TrainingModeError,
)
from fxmobile.options import MobileOptimizerType
from fxmobile.report import Report

__all__ = [
    "CaptureError",
    "FxMobileError",
    "FxResult",
    "InvalidArgumentError",
    "InvalidValueError",
    "MobileOptimizerType",
    "NumericsError",
    "PassError",
    "Report",
    "TrainingModeError",
    "optimize_fx",
]
