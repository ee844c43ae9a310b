"""fxmobile: eager PyTorch model in, optimized TorchScript for mobile runtimes out.

Importing fxmobile registers its C++ operator library (see fxmobile.backends.library).
"""

from fxmobile.api import (
    FxResult,
    MobileResult,
    ProgramResult,
    optimize,
    optimize_for_mobile,
    optimize_fx,
)
from fxmobile.backends.library import OpFamily, Provider, registration_status
from fxmobile.errors import (
    CaptureError,
    ExportError,
    FxMobileError,
    InputWriteError,
    InvalidArgumentError,
    InvalidValueError,
    LoweringError,
    MissingDependencyError,
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
    "ExportError",
    "FxMobileError",
    "FxResult",
    "InputWriteError",
    "InvalidArgumentError",
    "InvalidValueError",
    "LintCode",
    "LoweringError",
    "MissingDependencyError",
    "MobileOptimizerType",
    "MobileResult",
    "NumericalMismatchError",
    "OpFamily",
    "PassError",
    "ProgramResult",
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
