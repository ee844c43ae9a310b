"""fxmobile: eager PyTorch model in, optimized TorchScript for mobile runtimes out.

Importing fxmobile registers its C++ operator library (see fxmobile.backends.library).
"""

from fxmobile.api import FxResult, MobileResult, optimize, optimize_for_mobile, optimize_fx
from fxmobile.backends.library import OpFamily, Provider, registration_status
from fxmobile.errors import (
    CaptureError,
    FxMobileError,
    InputWriteError,
    InvalidArgumentError,
    InvalidValueError,
    NumericalMismatchError,
    PassError,
    RefusedError,
    ScriptingError,
    ScriptModuleError,
    TrainingModeError,
)
from fxmobile.options import Backend, Check, MobileOptimizerType
from fxmobile.report import Report
from fxmobile.script.lints import LintCode, generate_mobile_module_lints

__all__ = [
    "Backend",
    "CaptureError",
    "Check",
    "FxMobileError",
    "FxResult",
    "InputWriteError",
    "InvalidArgumentError",
    "InvalidValueError",
    "LintCode",
    "MobileOptimizerType",
    "MobileResult",
    "NumericalMismatchError",
    "OpFamily",
    "PassError",
    "Provider",
    "RefusedError",
    "Report",
    "ScriptModuleError",
    "ScriptingError",
    "TrainingModeError",
    "generate_mobile_module_lints",
    "optimize",
    "optimize_for_mobile",
    "optimize_fx",
    "registration_status",
]
