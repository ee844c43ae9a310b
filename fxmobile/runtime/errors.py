"""What can go wrong with a reference runtime, each naming the runtime and what to do."""

from __future__ import annotations

from fxmobile.errors import FxMobileError


class RuntimeNotInstalledError(FxMobileError, RuntimeError):
    """The reference runtime's venv is missing: ``make runtimes`` creates it."""


class RuntimeLoadError(FxMobileError, RuntimeError):
    """The runtime refused a file; ``runtime_message`` is what the runtime itself said."""

    def __init__(self, message: str, runtime_message: str) -> None:
        super().__init__(message)
        self.runtime_message = runtime_message


class RuntimeCallError(FxMobileError, RuntimeError):
    """A request failed inside the runtime (a run that raised, a value that cannot travel)."""

    def __init__(self, message: str, runtime_message: str) -> None:
        super().__init__(message)
        self.runtime_message = runtime_message


class RuntimeCrashedError(FxMobileError, RuntimeError):
    """The runtime's process died; the message carries its exit status and last output."""


class IncompatibleRuntimeError(FxMobileError, ValueError):
    """A file cannot be made loadable on the target runtime (an operator is newer than it)."""
