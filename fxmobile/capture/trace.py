"""Capture: symbolic tracing of a deep copy of the user's module.

The user's module is never touched: it is deep-copied first, the copy is traced, and every later
stage works on that copy. When tracing fails, the error names the innermost submodule that was
being traced and the user's source line, and suggests the fix (a leaf module or concrete args).
With ``auto_leaf=True`` each submodule that fails to trace is kept opaque instead, and the
report lists them.

Before tracing, capture refuses what it cannot optimize faithfully (``fxmobile.capture.checks``).
After tracing it refuses a forward that changes the module's state (``fxmobile.capture.mutation``)
or returns None; each refusal names the culprit and the fix.
"""

from __future__ import annotations

import copy
import inspect
import operator
import os
import traceback
import typing
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx, nn

from fxmobile.capture.checks import deep_copy, resolve_leaves, training_submodules
from fxmobile.capture.mutation import (
    GraphWrite,
    StateChange,
    StateSnapshot,
    WriteSeen,
    WriteWatch,
    fx_constants,
    graph_writes,
    owner_name,
)
from fxmobile.errors import CaptureError, InvalidValueError
from fxmobile.options import Options

__all__ = ["Capture", "capture"]

_TORCH_DIR = os.path.dirname(torch.__file__)
_FXMOBILE_DIR = os.path.dirname(os.path.dirname(__file__))


@dataclass(frozen=True)
class Capture:
    """The traced copy, and what capture had to do to get it.

    ``eager_copy`` is the deep copy that was traced; the graph module shares its submodules, so
    it runs the original eager forward only until a pass rewrites those submodules.
    """

    graph_module: fx.GraphModule
    eager_copy: nn.Module
    auto_leaves: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


class _Tracer(fx.Tracer):
    """A tracer that honours user leaves and remembers which submodule it was inside."""

    def __init__(
        self,
        leaf_types: tuple[type[nn.Module], ...],
        leaf_paths: set[str],
        record_frames: bool = False,
    ) -> None:
        super().__init__()
        self.leaf_types = leaf_types
        self.leaf_paths = leaf_paths
        self.failed_path: str | None = None
        # the user's source line of each node, by node name (only to explain a refusal)
        self.record_frames = record_frames
        self.frames: dict[str, str] = {}

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        if self.record_frames:
            where = _innermost_user_frame(traceback.extract_stack())
            if where:
                self.frames[node.name] = where
        return node

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaf_paths or isinstance(m, self.leaf_types):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(
        self, m: nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_path is None:
                self.failed_path = self.path_of_module(m)
            raise


def capture(model: nn.Module, options: Options) -> Capture:
    """Trace a deep copy of ``model`` with ``torch.fx``; ``model`` has passed ``admit``.

    ``options.leaf_modules`` (classes, submodule instances of ``model`` or qualified names) are
    kept as opaque calls; ``options.eval_copy`` puts the copy (never ``model``) in eval mode.
    """
    notes: list[str] = []
    leaf_types, leaf_paths = resolve_leaves(model, options.leaf_modules)
    concrete_args = dict(options.concrete_args) if options.concrete_args else None
    copied = deep_copy(model)
    training = training_submodules(copied)
    if training:
        copied.eval()
        notes.append(f"put fxmobile's copy in eval mode ({len(training)} modules were training)")

    before = StateSnapshot.of(copied)
    auto_leaves: list[str] = []
    while True:
        tracer = _Tracer(leaf_types, leaf_paths)
        try:
            graph = tracer.trace(copied, concrete_args=concrete_args)
            break
        except Exception as exc:
            path = tracer.failed_path
            if options.auto_leaf and path and path not in leaf_paths:
                leaf_paths.add(path)
                auto_leaves.append(path)
                continue
            raise _capture_error(copied, path, exc, options.auto_leaf) from exc
    changes = before.changes(copied, fx_constants(graph))
    writes = [replace(w, attribute=owner_name(copied, w.attribute)) for w in graph_writes(graph)]
    if changes or writes:
        where = _locate_write(model, leaf_types, leaf_paths, concrete_args, changes, writes)
        raise _mutation_error(model, changes, writes, where)
    if auto_leaves:
        notes.append(f"kept as opaque leaves because they do not trace: {', '.join(auto_leaves)}")
    _refuse_none_output(model, graph)
    name = type(model).__name__
    gm = fx.GraphModule(tracer.root, graph, class_name=name)
    if concrete_args:
        _bake_concrete_args(gm, copied, concrete_args)
    _resolve_string_annotations(gm, copied)
    return Capture(gm, copied, tuple(auto_leaves), tuple(notes))


def _refuse_none_output(model: nn.Module, graph: fx.Graph) -> None:
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    if output.args and output.args[0] is None:
        name = type(model).__name__
        raise InvalidValueError(
            f"{name}.forward returns None, so the optimized model would compute nothing "
            f"(fxmobile removes work whose result is unused). Fix: return the output tensor(s) "
            f"from {name}.forward (is a `return` missing?)."
        )


def _locate_write(
    model: nn.Module,
    leaf_types: tuple[type[nn.Module], ...],
    leaf_paths: set[str],
    concrete_args: dict[str, Any] | None,
    changes: list[StateChange],
    writes: list[GraphWrite],
) -> str | None:
    """The user's line that changes the state: traces a fresh copy once more, watching."""
    try:
        fresh = copy.deepcopy(model).eval()
        tensors = []
        for change in changes:
            value = getattr(fresh.get_submodule(change.module_path), change.name, None)
            if isinstance(value, torch.Tensor):
                tensors.append(value)
        tracer = _Tracer(leaf_types, set(leaf_paths), record_frames=True)
        with WriteWatch(tensors):
            tracer.trace(fresh, concrete_args=concrete_args)
    except WriteSeen as seen:
        return _user_frame(seen)
    except Exception:
        return None
    for write in writes:
        if write.node.name in tracer.frames:
            return tracer.frames[write.node.name]
    return None


def _mutation_error(
    model: nn.Module, changes: list[StateChange], writes: list[GraphWrite], where: str | None
) -> CaptureError:
    name = type(model).__name__
    culprits = [f"{c.what} {c.path!r} ({c.how})" for c in changes]
    culprits += [f"{w.attribute!r} (written in place by {w.op_name})" for w in writes]
    paths = [c.module_path for c in changes] + [w.attribute.rpartition(".")[0] for w in writes]
    owner = paths[0] if paths else ""
    at = f" at {where}" if where else ""
    fix = (
        "keep the state outside the model: take it as an input and return the new value, "
        "or compute it without writing to the module"
    )
    if owner:
        cls = type(model.get_submodule(owner)).__name__
        fix += (
            f"; or, if {owner!r} must keep its state, mark it as a leaf "
            f"(leaf_modules=[{cls}]) so it runs as eager code, unoptimized"
        )
    return CaptureError(
        f"{name}.forward changes the module's state while it runs{at}: "
        f"{'; '.join(culprits)}. torch.fx runs forward once to trace it, so the change would "
        f"happen once and its result be baked into the optimized model as a constant (and "
        f"fxmobile folds attributes into constants). Fix: {fix}."
    )


def _bake_concrete_args(gm: fx.GraphModule, root: nn.Module, concrete_args: dict[str, Any]) -> None:
    """Drop the placeholders of specialized arguments, and the guards fx put on them.

    ``torch.fx`` keeps a specialized argument as a parameter (with its original default!) plus a
    ``torch._assert`` that it equals the traced value. The optimized model is specialized, so
    the argument goes: its value is baked in and callers pass only the remaining inputs.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = list(inspect.signature(root.forward).parameters)
    by_name = dict(zip(params, placeholders, strict=False))
    for arg_name, value in concrete_args.items():
        node = by_name.get(arg_name)
        if node is None or value is fx.PH:
            continue
        for user in list(node.users):
            guards = [u for u in user.users if u.target is torch._assert]
            if user.target is operator.eq and len(user.users) == len(guards):
                for guard in guards:
                    gm.graph.erase_node(guard)
                gm.graph.erase_node(user)
        for user in list(node.users):  # any other use sees the baked-in value
            user.args = _substitute(user.args, node, value)
            user.kwargs = _substitute(user.kwargs, node, value)
        gm.graph.erase_node(node)
    gm.recompile()


def _resolve_string_annotations(gm: fx.GraphModule, root: nn.Module) -> None:
    """Evaluate annotations left as strings (``from __future__ import annotations``).

    fx copies them into the generated code as unresolvable names, which TorchScript rejects.
    One that does not resolve is dropped (TorchScript then assumes ``Tensor``).
    """
    if not any(isinstance(n.type, str) for n in gm.graph.nodes):
        return
    try:
        hints = typing.get_type_hints(root.forward)
    except Exception:
        hints = {}
    names = list(inspect.signature(root.forward).parameters)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for name, node in zip(names, placeholders, strict=False):
        if isinstance(node.type, str):
            node.type = hints.get(name)
    for node in gm.graph.nodes:
        if isinstance(node.type, str):
            node.type = hints.get("return") if node.op == "output" else None
    gm.recompile()


def _substitute(args: Any, node: fx.Node, value: Any) -> Any:
    def swap(n: fx.Node) -> Any:
        return value if n is node else n

    return fx.node.map_arg(args, swap)


def _innermost_user_frame(frames: traceback.StackSummary) -> str | None:
    """``file:line: code`` of the innermost frame outside torch and fxmobile, if any."""
    for frame in reversed(frames):
        if frame.filename.startswith((_TORCH_DIR, _FXMOBILE_DIR, "<eval_with_key>")):
            continue
        code = f": {frame.line.strip()}" if frame.line else ""
        return f"{frame.filename}:{frame.lineno}{code}"
    return None


def _user_frame(exc: BaseException) -> str | None:
    """The innermost user frame of ``exc``'s traceback."""
    return _innermost_user_frame(traceback.extract_tb(exc.__traceback__))


def _capture_error(
    root: nn.Module, path: str | None, exc: Exception, auto_leaf: bool
) -> CaptureError:
    """Name the submodule and line; the fix depends on whether fx met control flow on a traced
    value (``TraceError``) or forward raised an ordinary Python error while being traced."""
    where = _user_frame(exc)
    at = f" at {where}" if where else ""
    cause = f"{type(exc).__name__}: {exc}".strip()
    control_flow = isinstance(exc, fx.proxy.TraceError)
    if path:
        cls = type(root.get_submodule(path)).__name__
        fix = (
            f"mark it as a leaf (leaf_modules=[{cls}] or leaf_modules=[{path!r}]), pass "
            f"concrete_args for the input that drives the control flow, or pass auto_leaf=True"
        )
        if not control_flow:
            fix = (
                f"if that line also fails when you run the model eagerly, fix it there; "
                f"otherwise it cannot handle a traced value: {fix}"
            )
        return CaptureError(
            f"torch.fx could not trace submodule {path!r} ({cls}){at}: {cause}. Fix: {fix}."
        )
    fix = "pass concrete_args for the input that drives the control flow"
    if auto_leaf:
        fix += " (auto_leaf cannot help: the failure is in the top-level forward itself)"
    else:
        fix += ", or move the untraceable code into a submodule and mark it as a leaf"
    if not control_flow:
        fix = (
            f"if that line also fails when you run the model eagerly, fix it there; "
            f"otherwise it cannot handle a traced value: {fix}"
        )
    return CaptureError(
        f"torch.fx could not trace {type(root).__name__}.forward{at}: {cause}. Fix: {fix}."
    )
