"""Reference runtimes: real torch releases that run fxmobile's files as apps do.

See docs/pages/runtimes.md. ``make runtimes`` installs them under ``.runtimes/``;
``RuntimeProcess`` runs one in a child process of its venv; ``check_on_runtimes`` compares a
file's outputs there, ``compare_latency`` times candidates across processes, ``against_upstream``
does both against upstream's ``optimize_for_mobile``, and ``file_compatibility`` /
``backport_for`` say which runtime loads a file and make it loadable.
"""

from fxmobile.runtime.against_upstream import AgainstUpstream, against_upstream
from fxmobile.runtime.check import RuntimeCheck, check_on_runtimes, checks_table
from fxmobile.runtime.compat import (
    FileCompatibility,
    Verdict,
    backport_for,
    backport_to_bytecode,
    file_compatibility,
)
from fxmobile.runtime.errors import (
    IncompatibleRuntimeError,
    RuntimeCallError,
    RuntimeCrashedError,
    RuntimeLoadError,
    RuntimeNotInstalledError,
)
from fxmobile.runtime.install import RUNTIMES, RuntimeSpec
from fxmobile.runtime.latency import Here, Latency, OnRuntime, compare_latency, latency_table
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
    "AgainstUpstream",
    "FileCompatibility",
    "Here",
    "IncompatibleRuntimeError",
    "Latency",
    "LoadedFile",
    "OnRuntime",
    "RuntimeCallError",
    "RuntimeCheck",
    "RuntimeCrashedError",
    "RuntimeInfo",
    "RuntimeLoadError",
    "RuntimeNotInstalledError",
    "RuntimeProcess",
    "RuntimeSpec",
    "Verdict",
    "against_upstream",
    "backport_for",
    "backport_to_bytecode",
    "check_on_runtimes",
    "checks_table",
    "compare_latency",
    "file_compatibility",
    "installed",
    "latency_table",
    "require_installed",
    "runtime_spec",
]
