"""Capture: symbolic tracing of a deep copy of the user's module.

The user's module is never touched: it is deep-copied first, the copy is traced, and every later
stage works on that copy. When tracing fails, the error names the innermost submodule that was
being traced and the user's source line, and suggests the fix (a leaf module or concrete args).
With ``auto_leaf=True`` each submodule that fails to trace is kept opaque instead, and the
report lists them.
"""

from __future__ import annotations

import copy
import inspect
import operator
import os
import traceback
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from fxmobile.errors import CaptureError, InvalidArgumentError, TrainingModeError

LeafSpec = type[nn.Module] | nn.Module | str

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

    def __init__(self, leaf_types: tuple[type[nn.Module], ...], leaf_paths: set[str]) -> None:
        super().__init__()
        self.leaf_types = leaf_types
        self.leaf_paths = leaf_paths
        self.failed_path: str | None = None

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


def training_submodules(model: nn.Module) -> list[str]:
    """Qualified names of the submodules in training mode (``<root>`` for the module itself)."""
    return [name or "<root>" for name, m in model.named_modules() if m.training]


def capture(
    model: nn.Module,
    *,
    leaf_modules: Iterable[LeafSpec] = (),
    concrete_args: dict[str, Any] | None = None,
    auto_leaf: bool = False,
    eval_copy: bool = False,
) -> Capture:
    """Trace a deep copy of ``model`` with ``torch.fx``.

    ``leaf_modules`` takes module classes, submodule instances of ``model`` or qualified names;
    those are kept as opaque calls. ``eval_copy`` puts the copy (never ``model``) in eval mode
    instead of refusing a model that is still training.
    """
    check_module(model)
    training = require_eval(model, eval_copy)
    notes: list[str] = []
    leaf_types, leaf_paths = _resolve_leaves(model, leaf_modules)
    copied = _deep_copy(model)
    if training:
        copied.eval()
        notes.append(f"put fxmobile's copy in eval mode ({len(training)} modules were training)")

    auto_leaves: list[str] = []
    while True:
        tracer = _Tracer(leaf_types, leaf_paths)
        try:
            graph = tracer.trace(copied, concrete_args=concrete_args)
            break
        except Exception as exc:
            path = tracer.failed_path
            if auto_leaf and path and path not in leaf_paths:
                leaf_paths.add(path)
                auto_leaves.append(path)
                continue
            raise _capture_error(copied, path, exc, auto_leaf) from exc
    if auto_leaves:
        notes.append(f"kept as opaque leaves because they do not trace: {', '.join(auto_leaves)}")
    name = type(model).__name__
    gm = fx.GraphModule(tracer.root, graph, class_name=name)
    if concrete_args:
        _bake_concrete_args(gm, copied, concrete_args)
    _resolve_string_annotations(gm, copied)
    return Capture(gm, copied, tuple(auto_leaves), tuple(notes))


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


def require_eval(model: nn.Module, eval_copy: bool) -> list[str]:
    """The submodules still training; refused (listing them) unless ``eval_copy`` is set."""
    training = training_submodules(model)
    if training and not eval_copy:
        shown = ", ".join(training[:8])
        if len(training) > 8:
            shown += f" and {len(training) - 8} more"
        raise TrainingModeError(
            f"{type(model).__name__} is in training mode ({len(training)} submodules: "
            f"{shown}); mobile optimization folds inference-time constants and needs eval "
            f"mode. Call model.eval() first, or pass eval_copy=True to optimize an eval-mode "
            f"copy."
        )
    return training


def check_module(model: object) -> None:
    """Refuse anything that is not an eager ``nn.Module``."""
    if isinstance(model, torch.jit.ScriptModule):
        raise InvalidArgumentError(
            f"{type(model).__name__} is already TorchScript; torch.fx cannot trace it. Pass it to "
            f"fxmobile.optimize_for_mobile, which runs only the TorchScript stage on it."
        )
    if not isinstance(model, nn.Module):
        raise InvalidArgumentError(
            f"expected a torch.nn.Module to optimize, got {type(model).__module__}."
            f"{type(model).__qualname__}"
        )


def _resolve_leaves(
    model: nn.Module, leaf_modules: Iterable[LeafSpec]
) -> tuple[tuple[type[nn.Module], ...], set[str]]:
    paths_of = {id(m): name for name, m in model.named_modules()}
    known = set(paths_of.values())
    types: list[type[nn.Module]] = []
    paths: set[str] = set()
    for spec in leaf_modules:
        if isinstance(spec, type) and issubclass(spec, nn.Module):
            types.append(spec)
        elif isinstance(spec, nn.Module):
            if id(spec) not in paths_of:
                raise InvalidArgumentError(
                    f"leaf module {type(spec).__name__} instance is not a submodule of "
                    f"{type(model).__name__}; pass its class or its qualified name instead"
                )
            paths.add(paths_of[id(spec)])
        elif isinstance(spec, str):
            if spec not in known:
                raise InvalidArgumentError(
                    f"leaf module {spec!r} is not a submodule of {type(model).__name__}; "
                    f"qualified names look like 'layer1.0.conv1'"
                )
            paths.add(spec)
        else:
            raise InvalidArgumentError(
                f"leaf_modules items must be nn.Module classes, submodules or qualified names, "
                f"got {spec!r}"
            )
    return tuple(types), paths


def _deep_copy(model: nn.Module) -> nn.Module:
    try:
        return copy.deepcopy(model)
    except Exception as exc:
        raise InvalidArgumentError(
            f"could not deep-copy {type(model).__name__} ({type(exc).__name__}: {exc}). fxmobile "
            f"never modifies your model, so it optimizes a copy: make every attribute of the "
            f"model deep-copyable (or move it out of the module)."
        ) from exc


def _user_frame(exc: BaseException) -> str | None:
    """``file:line: code`` of the innermost frame outside torch and fxmobile, if any."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if frame.filename.startswith((_TORCH_DIR, _FXMOBILE_DIR)):
            continue
        code = f": {frame.line.strip()}" if frame.line else ""
        return f"{frame.filename}:{frame.lineno}{code}"
    return None


def _capture_error(
    root: nn.Module, path: str | None, exc: Exception, auto_leaf: bool
) -> CaptureError:
    where = _user_frame(exc)
    at = f" at {where}" if where else ""
    cause = f"{type(exc).__name__}: {exc}".strip()
    if path:
        cls = type(root.get_submodule(path)).__name__
        fix = (
            f"mark it as a leaf (leaf_modules=[{cls}] or leaf_modules=[{path!r}]), pass "
            f"concrete_args for the input that drives the control flow, or pass auto_leaf=True"
        )
        return CaptureError(
            f"torch.fx could not trace submodule {path!r} ({cls}){at}: {cause}. Fix: {fix}."
        )
    fix = "pass concrete_args for the input that drives the control flow"
    if auto_leaf:
        fix += " (auto_leaf cannot help: the failure is in the top-level forward itself)"
    else:
        fix += ", or move the untraceable code into a submodule and mark it as a leaf"
    return CaptureError(
        f"torch.fx could not trace {type(root).__name__}.forward{at}: {cause}. Fix: {fix}."
    )
