"""Module hooks at capture: traced into the graph where that is provably safe, kept otherwise.

torch runs a module's hooks in ``Module.__call__`` around ``forward``: forward pre-hooks may
replace the arguments (``hook(m, args)``, or ``hook(m, args, kwargs)`` with ``with_kwargs``),
forward hooks may replace the result (``hook(m, args, result)`` / ``hook(m, args, kwargs,
result)``). A leaf module's hooks are not in a traced graph: they run only when that module
object is called, so a fold that replaces or merges the module (conv + BatchNorm into one
conv), or the inlining of its call before scripting, would silently drop them. So, for each
module with forward hooks or pre-hooks, capture does one of two things:

- **traced**: when every hook is a plain function that, by its code, writes nothing outside
  its own locals (no attribute, item, global or closure stores, no container mutators such as
  ``append``) and reads only torch, ``math``, immutable values and other such functions,
  capture calls it on the proxies exactly as ``__call__`` would, so its work becomes graph
  nodes (a forward hook ``o + 1`` on a conv ends up in the conv's bias). The graph module then
  calls a copy of the module without those hooks, so they do not run twice.
- **kept**: otherwise the module stays a leaf called through ``__call__``: its hooks run at run
  time exactly as in eager, on real tensors, never on proxies, and no fold, inline or removal
  crosses the call (``fxmobile.ops`` calls a hooked module unknown). The TorchScript stage then
  compiles the hooks with the module where TorchScript can (or traces them, with example
  inputs).

A hook on the model itself is traced when it can be and refused otherwise (the model cannot be
a leaf of itself). torch's global module hooks (``register_module_forward_hook`` and its
pre-hook twin) are refused: they run around every module call in eager, the graph module's
remaining module calls would run them again, and a TorchScript module runs none. Backward hooks
do nothing under ``torch.no_grad`` and are only noted.
"""

from __future__ import annotations

import builtins
import copy
import dis
import functools
import inspect
import math
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as module_globals

from fxmobile.errors import RefusedError
from fxmobile.report.records import HookRecord

TRACED = "traced into the graph"
KEPT = "kept: the module is called with its hooks, and no rewrite crosses it"
NO_EFFECT = "no effect: backward hooks do not run under torch.no_grad"
RUN_BY_TRACE = "run by torch.jit.trace on the example inputs: its tensor work is in the graph"
COMPILED = "compiled with its module by torch.jit.script"


def hook_kinds(module: nn.Module) -> Iterator[tuple[str, Callable[..., Any]]]:
    """(kind, hook) for each forward pre-hook and forward hook of ``module``, in run order."""
    for hook_id, hook in module._forward_pre_hooks.items():
        kwargs = hook_id in module._forward_pre_hooks_with_kwargs
        yield ("forward pre-hook (with kwargs)" if kwargs else "forward pre-hook"), hook
    for hook_id, hook in module._forward_hooks.items():
        kwargs = hook_id in module._forward_hooks_with_kwargs
        yield ("forward hook (with kwargs)" if kwargs else "forward hook"), hook


def refuse_global_hooks() -> None:
    """Raise while torch's global module forward hooks or pre-hooks are registered."""
    found = [*module_globals._global_forward_pre_hooks.values()]
    found += module_globals._global_forward_hooks.values()
    if not found:
        return
    names = ", ".join(_name(h) for h in found)
    raise RefusedError(
        f"torch's global module hooks are registered ({names}): eager runs them around every "
        f"module call, and an optimized module cannot (its remaining module calls would run "
        f"them again, and TorchScript runs no Python hooks). Fix: remove them while optimizing "
        f"(handle.remove()), or register each on the module it should change "
        f"(module.register_forward_hook), which fxmobile captures."
    )


@dataclass
class HookPlan:
    """Which modules' hooks are traced and which modules are kept as hooked leaves."""

    traced: dict[int, nn.Module]  # id(module) -> module, hooks to run on proxies
    kept: set[str]  # qualified names of the modules kept as leaves with their hooks
    records: list[HookRecord]


def plan_hooks(model: nn.Module) -> HookPlan:
    """Decide for every hooked module of ``model`` (fxmobile's copy) whether to trace or keep."""
    plan = HookPlan({}, set(), [])
    for path, module in model.named_modules():
        hooks = list(hook_kinds(module))
        backward = [*module._backward_hooks.values(), *module._backward_pre_hooks.values()]
        plan.records += [HookRecord(path, "backward hook", _name(h), NO_EFFECT) for h in backward]
        if not hooks:
            continue
        reasons = [(kind, hook, why_not_traceable(hook)) for kind, hook in hooks]
        refused = [(kind, hook, r) for kind, hook, r in reasons if r is not None]
        if not refused:
            plan.traced[id(module)] = module
            plan.records += [HookRecord(path, kind, _name(h), TRACED) for kind, h in hooks]
            continue
        kind, hook, reason = refused[0]
        if not path:
            _refuse_root_hook(model, kind, hook, reason)
        plan.kept.add(path)
        action = f"{KEPT} ({_name(hook)}: {reason})"
        plan.records += [HookRecord(path, kind, _name(h), action) for kind, h in hooks]
    return plan


def fallback_hook_records(model: nn.Module, route: str) -> list[HookRecord]:
    """What a TorchScript fallback route (``torch.jit.trace`` or ``torch.jit.script``) did with
    every hook of ``model``: tracing ran each (its work on tensors is recorded; anything else it
    did, it did once, at trace time), scripting compiled each with its module."""
    records = []
    for path, module in model.named_modules():
        backward = [*module._backward_hooks.values(), *module._backward_pre_hooks.values()]
        records += [HookRecord(path, "backward hook", _name(h), NO_EFFECT) for h in backward]
        for kind, hook in hook_kinds(module):
            action = COMPILED
            if route == "torch.jit.trace":
                impure = why_not_traceable(hook)
                action = RUN_BY_TRACE
                if impure is not None:
                    action += f"; anything else it does ({impure}) happened once, at trace time"
            records.append(HookRecord(path, kind, _name(hook), action))
    return records


def refuse_untraceable_root_hooks(model: nn.Module) -> None:
    """Raise when a hook on ``model`` itself is not one fxmobile can trace into the graph. Checked
    before any route is tried: no route keeps such a hook (a model is not a call of itself, and
    torch.jit.trace would run it once, at trace time), so the fallback routes refuse it too."""
    for kind, hook in hook_kinds(model):
        reason = why_not_traceable(hook)
        if reason is not None:
            _refuse_root_hook(model, kind, hook, reason)


def _refuse_root_hook(model: nn.Module, kind: str, hook: Any, reason: str) -> None:
    raise RefusedError(
        f"{type(model).__name__} has a {kind} on itself ({_name(hook)}) that fxmobile "
        f"cannot trace into the graph: {reason}. Fix: register it on a submodule, where "
        f"fxmobile keeps the hooked call, or remove it while optimizing."
    )


def run_pre_hooks(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What ``Module.__call__`` does with the forward pre-hooks, on proxies."""
    for hook_id, hook in module._forward_pre_hooks.items():
        if hook_id in module._forward_pre_hooks_with_kwargs:
            result = hook(module, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(
                        f"forward pre-hook must return None or a tuple of (new_args, "
                        f"new_kwargs), but got {result}."
                    )
                args, kwargs = result
        else:
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    return args, kwargs


def run_forward_hooks(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
) -> Any:
    """What ``Module.__call__`` does with the forward hooks, on proxies."""
    for hook_id, hook in module._forward_hooks.items():
        if hook_id in module._forward_hooks_with_kwargs:
            out = hook(module, args, kwargs, result)
        else:
            out = hook(module, args, result)
        if out is not None:
            result = out
    return result


def without_hooks(module: nn.Module) -> nn.Module:
    """A new module object sharing ``module``'s tensors and children, with no forward hooks."""
    bare = copy.copy(module)
    for slot in (
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
    ):
        setattr(bare, slot, OrderedDict())
    return bare


class RootHooks:
    """While active, ``model``'s class calls its own hooks around ``forward`` (the class is
    swapped for a subclass whose ``forward`` does so), so torch.fx, which traces
    ``type(root).forward``, traces them too."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.cls = type(model)

    def __enter__(self) -> None:
        original = self.cls.forward

        @functools.wraps(original)
        def forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = run_pre_hooks(module, args, kwargs)
            return run_forward_hooks(module, args, kwargs, original(module, *args, **kwargs))

        self.model.__class__ = type(self.cls.__name__, (self.cls,), {"forward": forward})

    def __exit__(self, *exc: object) -> None:
        self.model.__class__ = self.cls


# What a traceable hook may do: instructions that write outside the hook's own locals.
_STORES = frozenset(
    {"STORE_ATTR", "DELETE_ATTR", "STORE_SUBSCR", "DELETE_SUBSCR", "STORE_GLOBAL",
     "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF", "STORE_NAME", "DELETE_NAME"}
)  # fmt: skip
# Methods that change a container (or a module) in place.
_MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault",
     "add", "discard", "register_buffer", "register_parameter", "register_module",
     "add_module", "register_forward_hook", "register_forward_pre_hook", "requires_grad_",
     "__setitem__", "__delitem__", "__setattr__", "__delattr__"}
)  # fmt: skip
# Builtins a traceable hook may call: they compute values and change nothing.
_PURE_BUILTINS = frozenset(
    {"len", "isinstance", "issubclass", "int", "float", "bool", "complex", "str", "tuple",
     "list", "dict", "set", "frozenset", "range", "min", "max", "abs", "sum", "zip",
     "enumerate", "type", "getattr", "hasattr", "any", "all", "round", "divmod", "slice",
     "reversed", "sorted", "map", "filter", "None", "True", "False", "NotImplemented",
     "ValueError", "TypeError", "RuntimeError"}
)  # fmt: skip


def why_not_traceable(hook: Callable[..., Any], depth: int = 0) -> str | None:
    """None when ``hook`` can be run on proxies without effects beyond its result, else why.

    Read from the hook's code: a plain function (not a bound method, ``functools.partial`` or
    callable object, whose state it could change), no stores outside its locals, no calls of
    container mutators, and every global or closure value it reads immutable, a module of
    torch or ``math``, a pure builtin, or a function that passes this check itself.
    """
    if isinstance(hook, functools.partial):
        return "it is a functools.partial"
    if inspect.ismethod(hook):
        return "it is a bound method, which may change its object"
    if not inspect.isfunction(hook):
        return f"it is a callable {type(hook).__name__} object, which may keep state"
    if depth > 3:
        return "it calls functions nested too deep to check"
    # An in-place method (``o.mul_(2)``) on a proxy is recorded as a graph node; on a tensor the
    # hook reads from its closure or globals it would run, and change that tensor.
    in_place = any(
        i.opname in ("LOAD_ATTR", "LOAD_METHOD") and _in_place_name(str(i.argval))
        for code in _code_objects(hook.__code__)
        for i in dis.get_instructions(code)
    )
    for code in _code_objects(hook.__code__):
        for instruction in dis.get_instructions(code):
            if instruction.opname in _STORES:
                return f"it writes outside its locals ({instruction.opname} {instruction.argval})"
            if instruction.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                name = str(instruction.argval)
                if name in _MUTATORS:
                    return f"it calls .{name}(), which changes a container or module in place"
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                reason = _global_reason(hook, str(instruction.argval), depth, in_place)
                if reason:
                    return reason
    for cell in hook.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        reason = _value_reason(value, depth, in_place)
        if reason:
            return f"its closure holds {reason}"
    return None


def _in_place_name(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_")


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _global_reason(hook: Any, name: str, depth: int, in_place: bool) -> str | None:
    if name in hook.__globals__:
        reason = _value_reason(hook.__globals__[name], depth, in_place)
        return f"it reads global {name!r}: {reason}" if reason else None
    if hasattr(builtins, name):
        return None if name in _PURE_BUILTINS else f"it calls the builtin {name}()"
    return None  # an unbound name: the hook raises when run, and is then kept


def _value_reason(value: Any, depth: int, in_place: bool) -> str | None:
    """None when reading ``value`` cannot let a hook change anything, else what it is."""
    if value is None or isinstance(value, bool | int | float | complex | str | bytes):
        return None
    if isinstance(value, torch.Tensor):
        return "a tensor, and the hook calls an in-place method" if in_place else None
    if isinstance(value, torch.dtype | torch.device | torch.Size):
        return None
    if isinstance(value, tuple | frozenset):
        reasons = (_value_reason(v, depth, in_place) for v in value)
        return next((r for r in reasons if r), None)
    if isinstance(value, types.ModuleType):
        root = value.__name__.split(".", 1)[0]
        return None if root in ("torch", "math", "operator") else f"the module {value.__name__}"
    if isinstance(value, type):
        return None  # classes are read (isinstance), not written, by the checks above
    if value is math or _from_torch_or_math(value):
        return None
    if inspect.isfunction(value):
        reason = why_not_traceable(value, depth + 1)
        return f"the function {_name(value)} ({reason})" if reason else None
    return f"a {type(value).__name__} object, which it may change"


def _from_torch_or_math(value: Any) -> bool:
    module = getattr(value, "__module__", None) or ""
    return callable(value) and module.split(".", 1)[0] in ("torch", "math", "_operator")


def _name(hook: Any) -> str:
    return str(getattr(hook, "__qualname__", None) or type(hook).__name__)
