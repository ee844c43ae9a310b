"""Capture-time detection of a forward that changes the module's own state.

``torch.fx`` runs ``forward`` once, on proxies. Code that changes the module while it runs is
either executed once at trace time and its result baked into the graph as a constant
(``self.n.add_(1); return x + self.n`` then returns ``x + 1`` forever), or recorded as an
in-place write to an attribute, which fxmobile's folding would later treat as a constant. Both
are refused. Three checks, each cheap:

* tensors: every parameter, buffer and plain tensor attribute is stamped with its identity and
  its version counter (bumped by every in-place op) before tracing, and compared after;
* plain Python attributes: each submodule's ``vars()`` (minus the slots ``nn.Module`` keeps for
  itself) are stamped by identity, containers and plain objects by the stamps of what they
  hold, a few levels down (a recorder kept as an attribute, whose list its hook fills);
* the graph: an in-place op (``add_``, ``copy_``, ``x[i] = v``, ``inplace=True``, ``out=``)
  whose target is a ``get_attr`` value or a view of one.

Only when something is found, the model is traced once more (a fresh copy) to find the source
line: see ``WriteWatch``.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.overrides import TorchFunctionMode

from fxmobile import ops

# What nn.Module.__init__ puts in every module's __dict__: torch's bookkeeping, not user state.
_MODULE_SLOTS = frozenset(vars(nn.Module()))


@dataclass(frozen=True)
class StateChange:
    """One piece of module state that tracing changed."""

    module_path: str  # "" for the root
    name: str  # the attribute's name in that module
    what: str  # "buffer", "parameter", "tensor attribute" or "attribute"
    how: str  # "changed in place", "replaced", "added", ...

    @property
    def path(self) -> str:
        return f"{self.module_path}.{self.name}" if self.module_path else self.name


def _version(t: torch.Tensor) -> int | None:
    try:
        return int(t._version)
    except Exception:  # inference tensors have no version counter
        return None


# How far stamps follow plain objects and containers into what an attribute holds: a hook
# object kept as an attribute (``self.sink = Recorder()``) whose list fills in forward is two
# levels down.
_STAMP_DEPTH = 4
# Values whose insides are not state of the model: code, types, and modules (stamped on their
# own by _entries).
_OPAQUE = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           types.ModuleType, nn.Module, torch.dtype, torch.device)  # fmt: skip


def _stamp(value: Any, depth: int = 0, seen: frozenset[int] = frozenset()) -> tuple[Any, ...]:
    """Identity of ``value`` and, for tensors, their version; for containers and plain
    objects, the stamps of what they hold, to ``_STAMP_DEPTH`` levels (a cycle stops at the
    identity of the object met again)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), _version(value))
    if depth >= _STAMP_DEPTH or id(value) in seen or isinstance(value, _OPAQUE):
        return ("object", id(value))
    inner = seen | {id(value)}
    if isinstance(value, list | tuple | set | frozenset):
        items = value if not isinstance(value, set | frozenset) else sorted(value, key=id)
        return ("items", id(value), tuple(_stamp(v, depth + 1, inner) for v in items))
    if isinstance(value, dict):
        return (
            "items",
            id(value),
            tuple((k, _stamp(v, depth + 1, inner)) for k, v in value.items()),
        )
    fields = getattr(value, "__dict__", None)
    if isinstance(fields, dict):
        return (
            "object",
            id(value),
            tuple((k, _stamp(v, depth + 1, inner)) for k, v in fields.items()),
        )
    return ("object", id(value))


def _entries(model: nn.Module) -> Iterator[tuple[tuple[str, str], str, Any]]:
    for path, module in model.named_modules():
        for name, param in module._parameters.items():
            yield (path, name), "parameter", param
        for name, buf in module._buffers.items():
            yield (path, name), "buffer", buf
        for name, value in vars(module).items():
            if name not in _MODULE_SLOTS:
                kind = "tensor attribute" if isinstance(value, torch.Tensor) else "attribute"
                yield (path, name), kind, value


@dataclass(frozen=True)
class StateSnapshot:
    """Identity (and, for tensors, version) of every piece of state of a module tree."""

    stamps: dict[tuple[str, str], tuple[str, tuple[Any, ...], Any]]

    @classmethod
    def of(cls, model: nn.Module) -> StateSnapshot:
        # The values are kept alive so that their ids stay unique while we compare.
        return cls({key: (kind, _stamp(value), value) for key, kind, value in _entries(model)})

    def changes(
        self,
        model: nn.Module,
        fx_constants: frozenset[str] = frozenset(),
        recomputed: frozenset[tuple[str, str]] = frozenset(),
    ) -> list[StateChange]:
        """What differs now; ``fx_constants`` are root attributes torch.fx itself added to hold
        the constants of the graph (``_tensor_constant0``), not changes made by forward;
        ``recomputed`` are (module path, attribute) pairs a pre-hook sets before every call
        (``torch.nn.utils.weight_norm``'s ``weight``): the same value each call, not state."""
        now = {
            key: (kind, _stamp(value))
            for key, kind, value in _entries(model)
            if key not in recomputed
        }
        stamps = {key: value for key, value in self.stamps.items() if key not in recomputed}
        for name in fx_constants:
            if ("", name) not in stamps:
                now.pop(("", name), None)
        found = []
        for key, (kind, stamp, _) in stamps.items():
            if key not in now:
                found.append(StateChange(*key, kind, "deleted"))
                continue
            new = now[key][1]
            if new == stamp:
                continue
            in_place = stamp[0] == new[0] and stamp[1] == new[1]
            how = "changed in place" if in_place else "reassigned"
            found.append(StateChange(*key, kind, how))
        for key, (kind, _) in now.items():
            if key not in stamps:
                found.append(StateChange(*key, kind, "added"))
        return found


@dataclass(frozen=True)
class GraphWrite:
    """An in-place op recorded in the graph whose target is (a view of) a module attribute."""

    node: fx.Node
    attribute: str  # qualified name of the get_attr target

    @property
    def op_name(self) -> str:
        target = self.node.target
        return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _written(node: fx.Node) -> list[fx.Node]:
    """The nodes a known in-place op writes to (``fxmobile.ops``; a user function kept opaque
    is not known to write: only its traced callers' state is checked)."""
    if node.op not in ("call_method", "call_function"):
        return []
    info = ops.call_op(node)
    return ops.written_inputs(node) if info.writes and info.name is not None else []


def fx_constants(graph: fx.Graph) -> frozenset[str]:
    """Names of the root attributes that torch.fx made to hold constants of ``graph``."""
    return frozenset(
        str(n.target) for n in graph.nodes if n.op == "get_attr" and "." not in str(n.target)
    )


def owner_name(root: nn.Module, qualname: str) -> str:
    """The parameter or buffer that the attribute ``qualname`` shares memory with: torch.fx
    stores a view of a buffer made at trace time (``self.n.view(-1)``) as a constant of its own.
    """
    value = getattr(root, qualname, None) if "." not in qualname else None
    if not isinstance(value, torch.Tensor):
        return qualname
    storage = storage_key(value)
    named: list[tuple[str, torch.Tensor]] = [*root.named_parameters(remove_duplicate=False)]
    named += root.named_buffers(remove_duplicate=False)
    for name, tensor in named:
        if name != qualname and storage_key(tensor) == storage:
            return name
    return qualname


def graph_writes(graph: fx.Graph) -> list[GraphWrite]:
    """In-place ops on ``get_attr`` values, or on views of them, in ``graph``."""
    aliases: dict[fx.Node, str] = {}
    found = []
    for node in graph.nodes:
        if node.op == "get_attr":
            aliases[node] = str(node.target)
            continue
        written = _written(node)
        found += [GraphWrite(node, aliases[w]) for w in written if w in aliases]
        base = node.args[0] if node.args else None
        view = node.op in ("call_method", "call_function") and ops.call_op(node).view
        if isinstance(base, fx.Node) and base in aliases and (view or base in written):
            aliases[node] = aliases[base]
    return found


class WriteSeenError(Exception):
    """Raised by ``WriteWatch`` at the user's line that writes to a watched tensor."""


class WriteWatch(TorchFunctionMode):
    """While active, an in-place op on a tensor sharing storage with a watched one raises
    ``WriteSeenError``, so the traceback ends at the user's line that did it."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.storages = {storage_key(t) for t in tensors} - {None}

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = kwargs.get("out", args[0] if args else None)
        writes = "out" in kwargs or kwargs.get("inplace") is True
        writes |= isinstance(name, str) and ops.aten(name).writes
        if writes and isinstance(target, torch.Tensor) and storage_key(target) in self.storages:
            raise WriteSeenError(name)
        return func(*args, **kwargs)


def storage_key(t: torch.Tensor) -> int | None:
    """The address of ``t``'s storage, shared by every view of it; None when it has none."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # sparse, nested: no plain storage
        return None
