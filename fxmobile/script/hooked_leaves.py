"""Scripting a graph module with each hooked module it calls traced on its own.

Capture keeps a module whose hooks it cannot trace as a call through ``__call__``, so the hooks
run. A hook TorchScript cannot compile (a recorder object) then stops scripting the whole
module, and tracing the whole module would record only the tensor ops it sees (a write through
``.data`` is not one). So each hooked module is traced alone, hooks included, with the arguments
it got on a run of the graph on the example inputs, and the rest is scripted around it. A module
called more than once, or with keyword arguments, is not (one trace is not enough for two
calls), nor one whose trace does not replay it (``fxmobile.script.jit_trace.replays``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import fx, nn

from fxmobile import ops
from fxmobile.errors import RefusedError
from fxmobile.script.jit_trace import replays, trace
from fxmobile.script.quiet_script import quietly_script
from fxmobile.verify import clone_inputs


def script_with_traced_hooked_leaves(
    gm: fx.GraphModule, example_inputs: tuple[Any, ...]
) -> tuple[torch.jit.ScriptModule, list[str]] | None:
    """``gm`` scripted with each hooked module it calls traced on its own, and their names;
    None when that does not script, or a trace does not replay its module."""
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_module"]
    hooked = [t for t in dict.fromkeys(targets) if ops.has_hooks(gm.get_submodule(t))]
    if not hooked or any(targets.count(t) > 1 for t in hooked):
        return None
    calls: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    handles = []
    for target in hooked:

        def record(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], target: str = target
        ) -> None:
            calls[target] = (clone_inputs(args), kwargs)

        module = gm.get_submodule(target)
        handles.append(module.register_forward_pre_hook(record, prepend=True, with_kwargs=True))
    try:
        with torch.no_grad():
            gm(*clone_inputs(example_inputs))
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
    if set(calls) != set(hooked) or any(kwargs for _, kwargs in calls.values()):
        return None
    partly = copy.copy(gm)
    partly._modules = dict(gm._modules)
    try:
        for target in hooked:
            args = calls[target][0]
            traced, warned, before = trace(gm.get_submodule(target), args)
            # the trace may hold only what the example decided
            if warned or replays(traced, before, args) is not None:
                return None
            _set_submodule(partly, target, traced)
        return quietly_script(partly), hooked
    except RefusedError:  # a seed call in a hooked module: no route takes it
        raise
    except Exception:
        return None


def _set_submodule(root: nn.Module, target: str, module: nn.Module) -> None:
    """``root``'s submodule at ``target`` replaced by ``module``, copying each parent on the
    path so the module ``root`` was copied from keeps its own."""
    *parents, leaf = target.split(".")
    owner = root
    for name in parents:
        child = copy.copy(owner.get_submodule(name))
        child._modules = dict(child._modules)
        owner._modules[name] = child
        owner = child
    owner._modules[leaf] = module
