"""The state fxmobile's own runs change, set back: the module handed back starts where the
caller's model is.

fxmobile runs the model, or the module it makes, on the example inputs: eager's reference,
shape propagation, tracing, probes of frozen graphs, the gate. A forward that keeps state
between calls (a counter buffer it increments, ``self.calls += 1`` in a module kept as a leaf)
would advance it in the module handed back, which would then start where fxmobile's last run
left it (a counter at 4) instead of where the caller's model is (0).

``state_kept(module, caller)`` stamps every piece of ``module``'s state before a run (identity
and version of each tensor, identity of every other attribute, the value of a TorchScript
attribute: no copy, so cheap) and sets back, after it, what the run changed, from ``caller``,
the user's model, under the same qualified name. The caller's model is never run nor modified,
so it holds the state as it was. And the state a forward writes is state no pass rewrites (a
pass folds the weights a forward only reads; capture refuses a traced write, so writes happen
in modules kept as leaves; freezing keeps a written attribute as an attribute): it keeps its
name, and the caller's value is the one to start from.

A pass that rewrites a module replaces it (``add_submodule``) or gives it new tensors: only
state whose owner module is the same object before and after, and whose value now differs from
the caller's, is set back, so a rewrite in the span is never undone.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from fxmobile.capture.mutation import _MODULE_SLOTS, _stamp
from fxmobile.errors import RefusedError

# TorchScript's own bookkeeping attributes (the mode flag is not state a forward keeps).
_SCRIPT_BOOKKEEPING = frozenset({"training", "_is_full_backward_hook"})

# (module path, attribute name)
Key = tuple[str, str]
# per key: the owner module's identity, the value's stamp, the value
Stamps = dict[Key, tuple[int, Any, Any]]


def model_name(model: nn.Module) -> str:
    """The name messages give ``model``: its class's, or the one a ScriptModule was compiled
    from."""
    if isinstance(model, torch.jit.ScriptModule):
        return str(model.original_name)
    return type(model).__name__


def state_entries(module: nn.Module) -> Iterator[tuple[Key, nn.Module, Any]]:
    """Every piece of state of ``module``'s tree: (path, name), the owner module, the value.

    Eager modules: parameters, buffers and plain attributes. ScriptModules: their attributes
    (parameters and buffers among them), but neither submodules nor the mode flag.
    """
    for path, owner in module.named_modules(remove_duplicate=False):
        if isinstance(owner, torch.jit.ScriptModule):
            iterators = torch._C._jit_debug_module_iterators(owner._c)  # type: ignore[attr-defined]
            attributes = iterators["named_attributes"]
            for name, value in attributes:
                if name in _SCRIPT_BOOKKEEPING or isinstance(value, torch._C.ScriptObject):
                    continue
                if isinstance(value, torch._C.ScriptModule):
                    continue
                yield (path, name), owner, value
            continue
        for name, param in owner._parameters.items():
            yield (path, name), owner, param
        for name, buf in owner._buffers.items():
            yield (path, name), owner, buf
        for name, value in vars(owner).items():
            if name not in _MODULE_SLOTS and not isinstance(owner, torch.fx.GraphModule):
                yield (path, name), owner, value


def _script_stamp(value: Any) -> Any:
    """A TorchScript attribute's stamp: each read converts it anew (a fresh list, a fresh int),
    so containers and scalars are stamped by value; tensors keep their identity."""
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), value._version)
    if isinstance(value, list | tuple):
        return ("items", tuple(_script_stamp(v) for v in value))
    if isinstance(value, dict):
        return ("items", tuple((k, _script_stamp(v)) for k, v in value.items()))
    return ("value", value)


def snapshot(module: nn.Module) -> Stamps:
    """Per key: the owner's identity, the value's stamp, and the value (kept alive, so the
    identities in the stamps stay unique while compared)."""
    found = {}
    for key, owner, value in state_entries(module):
        script = isinstance(owner, torch.jit.ScriptModule)
        found[key] = (id(owner), _script_stamp(value) if script else _stamp(value), value)
    return found


def _lookup(root: nn.Module, key: Key) -> tuple[bool, Any]:
    """Whether ``root`` has the state ``key``, and its value."""
    path, name = key
    owner = _submodule(root, path)
    if owner is None:
        return False, None
    if isinstance(owner, torch.jit.ScriptModule):
        if not owner._c.hasattr(name):
            return False, None
        return True, owner._c.getattr(name)
    if name in owner._parameters:
        return True, owner._parameters[name]
    if name in owner._buffers:
        return True, owner._buffers[name]
    if name in vars(owner):
        return True, vars(owner)[name]
    if parametrize.is_parametrized(owner, name):  # weight_norm's weight: computed on each read
        with torch.no_grad():
            return True, getattr(owner, name)
    return False, None


def _submodule(root: nn.Module, path: str) -> nn.Module | None:
    """``root``'s submodule at ``path`` (ScriptModules have no ``get_submodule``); None when
    there is none."""
    owner: Any = root
    for part in path.split(".") if path else ():
        owner = getattr(owner, part, None)
        if not isinstance(owner, nn.Module):
            return None
    return owner


def same_value(a: Any, b: Any) -> bool:
    """Whether two pieces of state hold the same value (tensors: dtype, shape and values, NaN
    equal to NaN; containers item by item; anything else by ``==``, or by identity where
    ``==`` does not answer)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return bool(torch.equal(a, b)) or (
            a.is_floating_point() and bool(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
        )
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _set_back(module: nn.Module, caller: nn.Module, key: Key, name: str) -> None:
    """Give ``module``'s state ``key`` the caller's value: a tensor in place (anything sharing
    it, a traced or frozen module made from this one, sees it too), anything else as a copy.
    State the caller does not have cannot be set back: refused, naming it."""
    path, attribute = key
    owner = _submodule(module, path)
    assert owner is not None  # the key is one of module's state entries
    has, wanted = _lookup(caller, key)
    _, current = _lookup(module, key)
    qualified = f"{path}.{attribute}" if path else attribute
    if not has:
        raise RefusedError(
            f"running {name} on the example inputs changed its {qualified!r}, and the model "
            f"has no {qualified!r} to set it back from, so the optimized module would start "
            f"from another state than the model. Fix: keep that state outside the model (take "
            f"it as an input and return the new value)"
        )
    if (
        isinstance(current, torch.Tensor)
        and isinstance(wanted, torch.Tensor)
        and current.shape == wanted.shape
        and current.dtype == wanted.dtype
    ):
        with torch.no_grad():
            current.copy_(wanted)
        return
    value = copy.deepcopy(wanted)
    if isinstance(owner, torch.jit.ScriptModule):
        owner._c.setattr(attribute, value)
    else:
        setattr(owner, attribute, value)


@contextlib.contextmanager
def state_kept(module: Any, caller: nn.Module | None) -> Iterator[None]:
    """Whatever runs inside leaves ``module``'s state as ``caller`` (the user's model) has it,
    where the run changed it (see the module's docstring). A ``module`` that is not an
    ``nn.Module`` (an ExecuTorch runner), or no ``caller``, is left alone."""
    if caller is None or not isinstance(module, nn.Module):
        yield
        return
    before = snapshot(module)
    try:
        yield
    finally:
        restore_changed(module, caller, before)


def restore_changed(module: nn.Module, caller: nn.Module, before: Stamps) -> None:
    """Set back from ``caller`` the state of ``module`` that changed since ``before`` (its
    ``snapshot``), where the owner is the same module and the value is not the caller's.
    State added since (a pass's folded constant) is not the caller's to judge, and stays."""
    after = snapshot(module)
    for key, (owner, stamp, current) in after.items():
        old = before.get(key)
        if old is None or old[0] != owner or old[1] == stamp:
            continue  # added, on a rewritten module, or untouched
        has, wanted = _lookup(caller, key)
        if has and same_value(current, wanted):
            continue
        _set_back(module, caller, key, model_name(caller))


def match_caller(module: torch.jit.ScriptModule, caller: nn.Module) -> None:
    """Give every attribute of a frozen ``module`` (or of a module no pass has rewritten yet)
    that the caller's model also has the caller's value.

    What freezing leaves as attributes is what a forward writes, and what the caller asked to
    preserve, neither of which any pass rewrites: where it differs from the caller's, one of
    fxmobile's runs (a trace, a probe, the gate) changed it."""
    for key, _, value in list(state_entries(module)):
        has, wanted = _lookup(caller, key)
        if has and not same_value(value, wanted):
            _set_back(module, caller, key, model_name(caller))
