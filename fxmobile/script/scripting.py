"""Turning the FX result into TorchScript: script it, or trace it when scripting fails.

``torch.jit.script`` is tried first because it keeps control flow. FX writes the original
forward's return annotation into the generated code, which breaks scripting when the eager
forward was annotated with a type it does not return in eval mode (torchvision's googlenet and
inception_v3 annotate a namedtuple and return a tensor): the annotation is dropped, and
TorchScript infers the return type. When scripting still fails and example inputs were given,
the module is traced instead and the report says so.

The FX stage's last pass (``fxmobile.passes.inline_modules``) has written calls to standard leaf
modules out as the functions their ``forward`` calls: TorchScript then compiles one method
instead of one type per submodule, and freezing has nothing to inline.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import fx

from fxmobile.errors import ScriptingError


def quietly_script(module: torch.nn.Module) -> torch.jit.ScriptModule:
    """``torch.jit.script`` without its deprecation warning: fxmobile needs TorchScript.

    The result shares compiled types (and so method graphs) with every other scripted
    instance of the same classes: never rewrite its graphs in place before freezing, which
    gives the frozen module types of its own.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script. is deprecated")
        # about how the TorchScript frontend reads some torchvision __init__ annotations
        warnings.filterwarnings("ignore", message="The TorchScript type system doesn't support")
        return torch.jit.script(module)


def clone_script_module(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """A copy of the module's state (attributes, training flags); it shares the types."""
    return copy.deepcopy(module)


def _alias_aware_type_as(gm: fx.GraphModule) -> None:
    """``a.type_as(b)`` -> ``a.to(b)``: the same op (dtype and device of ``b``), but
    TorchScript's schema for ``type_as`` calls its result fresh, although it is ``a`` itself when
    nothing converts, so TorchScript removed a write through it as dead code; ``to`` carries the
    alias annotation."""
    for node in gm.graph.nodes:
        if node.op == "call_method" and node.target == "type_as" and len(node.args) == 2:
            node.target = "to"
    gm.recompile()


def _drop_return_annotation(gm: fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        if node.op == "output":
            node.type = None
    gm.recompile()


def to_torchscript(
    gm: fx.GraphModule, example_inputs: tuple[Any, ...] | None
) -> tuple[torch.jit.ScriptModule, str | None]:
    """A ``ScriptModule`` for ``gm``, and a note when it had to be traced instead of scripted."""
    _drop_return_annotation(gm)
    _alias_aware_type_as(gm)
    try:
        return quietly_script(gm), None
    except Exception as exc:
        reason = str(exc).strip().splitlines()
        first = reason[0] if reason else type(exc).__name__
        if example_inputs is None:
            raise ScriptingError(
                f"torch.jit.script could not compile the optimized {type(gm).__name__}: "
                f"{exc}\nFix: pass example_inputs so fxmobile can trace it instead, or mark the "
                f"submodule named above as a leaf and make it scriptable."
            ) from exc
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.trace. is deprecated")
        traced = torch.jit.trace(gm, example_inputs, check_trace=False, strict=False)
    note = (
        f"scripting failed ({first}); traced with the example inputs instead, so control "
        f"flow is fixed to the path those inputs took"
    )
    return traced, note
