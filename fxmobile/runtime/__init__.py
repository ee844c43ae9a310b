"""Reference runtimes: real torch releases that run fxmobile's files as apps do.

See the README's "Reference runtimes". ``make runtimes`` installs them under ``.runtimes/``;
``RuntimeProcess`` runs one in a child process of its venv.
"""

from fxmobile.runtime.errors import (
    IncompatibleRuntimeError,
    RuntimeCallError,
    RuntimeCrashedError,
    RuntimeLoadError,
    RuntimeNotInstalledError,
)
from fxmobile.runtime.install import RUNTIMES, RuntimeSpec
from fxmobile.runtime.process import (
    LoadedFile,
    RuntimeInfo,
    RuntimeProcess,
    installed,
    require_installed,
    runtime_spec,
)

__all__ = [
    "RUNTIMES",
    "IncompatibleRuntimeError",
    "LoadedFile",
    "RuntimeCallError",
    "RuntimeCrashedError",
    "RuntimeInfo",
    "RuntimeLoadError",
    "RuntimeNotInstalledError",
    "RuntimeProcess",
    "RuntimeSpec",
    "installed",
    "require_installed",
    "runtime_spec",
]
