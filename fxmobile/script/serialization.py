"""Writing lite-interpreter files, without torch's deprecation warning for the format.

fxmobile exists to produce files for PyTorch's mobile runtimes; the warning that the lite
interpreter is deprecated in favour of ExecuTorch is documented in the README once instead of
being printed on every save.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*Lite Interpreter is deprecated")
        yield


def lite_interpreter_bytes(module: torch.jit.ScriptModule) -> bytes:
    """``module`` saved for the lite interpreter, as the bytes of a ``.ptl`` file."""
    with _quiet():
        return bytes(module._save_to_buffer_for_lite_interpreter())
