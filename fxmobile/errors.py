"""Exceptions fxmobile raises for bad input.

Every message names the module, method or argument at fault and says what to do about it.
Each class also derives from the built-in exception a caller would expect (``TypeError`` for a
wrong kind of argument, ``ValueError`` for a wrong value), so existing ``except`` clauses keep
working when a caller switches from ``torch.utils.mobile_optimizer``.
"""

from __future__ import annotations

import os
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fxmobile.report.records import Report


class FxMobileError(Exception):
    """Base class of every error fxmobile raises on purpose."""


class InvalidArgumentError(FxMobileError, TypeError):
    """An argument is of the wrong kind (not a module, not a pass, not a tensor...)."""


class InvalidValueError(FxMobileError, ValueError):
    """An argument has the right kind but a value fxmobile cannot work with."""


class TrainingModeError(FxMobileError, ValueError):
    """The model, or some of its submodules, is still in training mode."""


class CaptureError(FxMobileError, RuntimeError):
    """``torch.fx`` could not trace the model."""


class RefusedError(CaptureError):
    """A capture refusal that no other route (``torch.jit.trace``, ``torch.jit.script``) can
    take either: torch's global module hooks, a hook on the model itself that cannot be traced."""


class InputWriteError(RefusedError):
    """The forward writes to an input in a way the captured graph does not: no route takes it
    (the numerical check compares outputs, not what a call leaves in its inputs)."""


class ExportError(CaptureError):
    """``torch.export`` could not take the model, so no ExecuTorch program can be made of it;
    the message gives export's reason and the route that takes it (the lite-interpreter file)."""


class LoweringError(FxMobileError, RuntimeError):
    """ExecuTorch's lowering or runtime failed on a program fxmobile exported."""


class MissingDependencyError(FxMobileError, ImportError):
    """An optional dependency the call needs is not installed; the message says how to."""


class PassError(FxMobileError, RuntimeError):
    """A pass failed; the message says which passes ran before it."""


class NumericalMismatchError(FxMobileError, ValueError):
    """The optimized model's outputs differ from eager beyond the tolerance.

    ``report`` is the report of the run that failed: every pass, and the failed check.
    """

    def __init__(self, message: str, report: Report) -> None:
        super().__init__(message)
        self.report = report


class ScriptingError(FxMobileError, RuntimeError):
    """The model could not be turned into TorchScript."""


class ScriptModuleError(FxMobileError, RuntimeError):
    """A TorchScript-level step failed on the given ``ScriptModule``."""


def innermost_user_frame(frames: traceback.StackSummary) -> str | None:
    """``file:line: code`` of the innermost frame outside torch and fxmobile, if any: the
    user's line an error message should point at."""
    for frame in reversed(frames):
        if frame.filename.startswith((*_library_dirs(), "<eval_with_key>", "<fxmobile")):
            continue
        code = f": {frame.line.strip()}" if frame.line else ""
        return f"{frame.filename}:{frame.lineno}{code}"
    return None


def user_frame(exc: BaseException) -> str | None:
    """The innermost user frame of ``exc``'s traceback."""
    return innermost_user_frame(traceback.extract_tb(exc.__traceback__))


def _library_dirs() -> tuple[str, ...]:
    import torch  # errors.py is imported before anything heavy; torch is loaded by then

    return (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))
