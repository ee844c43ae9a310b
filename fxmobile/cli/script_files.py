"""Loading saved TorchScript files: full TorchScript, and the lite interpreter's view of them.

Files fxmobile writes name prepacked operators and context classes (``prepacked::``,
``xnnpack.*OpContext``...) that a stock torch 2.15 lacks, so every op family is registered before
anything is loaded. When ``torch.jit.load`` refuses a file, the archive is looked at to say why
in the user's terms (a checkpoint, a lite-only file, not an archive at all) instead of showing
torch's reader errors.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.jit.mobile

from fxmobile.backends.library import OpFamily, ensure_registered
from fxmobile.cli.common import CliError

_WRITERS = "torch.jit.save, torch.jit.script(...)._save_for_lite_interpreter or fxmobile optimize"


def register_all_families() -> None:
    """Register every fxmobile op family, so that any file fxmobile wrote can be loaded."""
    for family in OpFamily:
        ensure_registered(family)


def load_script_module(path: Path) -> torch.jit.ScriptModule:
    """The TorchScript module saved at ``path``, on the CPU."""
    if not path.is_file():
        raise CliError(f"{path}: no such file")
    register_all_families()
    try:
        return torch.jit.load(str(path), map_location="cpu")
    except RuntimeError as exc:
        raise CliError(f"{path}: {_why_unreadable(path, exc)}") from None


def has_bytecode(path: Path) -> bool:
    """Whether the file has lite-interpreter bytecode (_save_for_lite_interpreter writes it)."""
    members = _members(path)
    return members is not None and any(name.endswith("/bytecode.pkl") for name in members)


def load_lite(path: Path) -> Any:
    """The file as the lite interpreter (PyTorch's mobile runtime) loads it."""
    register_all_families()
    return torch.jit.mobile._load_for_lite_interpreter(str(path))


def _members(path: Path) -> list[str] | None:
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as archive:
        return archive.namelist()


def _why_unreadable(path: Path, exc: RuntimeError) -> str:
    members = _members(path)
    if members is None:
        return f"not a TorchScript file (not a zip archive); expected a file written by {_WRITERS}"
    if has_bytecode(path):
        try:
            load_lite(path)
        except RuntimeError:
            pass
        else:
            return (
                "only the lite interpreter can read this file (it holds bytecode but not the "
                "TorchScript code fxmobile rewrites); optimize the original model instead, or "
                "a copy saved with torch.jit.save"
            )
    if not any(name.endswith("/constants.pkl") for name in members):
        return (
            "a torch.save checkpoint (pickled tensors or a state dict), not TorchScript; load "
            "it into your model class and pass SPEC path/to/model.py:ClassName instead"
        )
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"torch.jit.load cannot read it ({first})"
