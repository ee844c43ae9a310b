"""The tracers capture uses, and the order it tries them in.

1. **plain**: ``torch.fx`` as it is, with the user's leaves and concrete arguments; a graph
   that keeps shapes symbolic (what every model that traces today gets).
2. **shape-aware** (with example inputs): ``fxmobile.capture.shapes``: shape questions answer
   from the example inputs, ``*args`` / ``**kwargs`` and optional parameters bind to them; the
   graph is specialized to their shapes and guarded.
3. **automatic leaves** (``auto_leaf=True``, the default): the submodule that failed becomes an
   opaque leaf, and again, until the top-level forward traces.

Each route declined is remembered with why, for the report. In every route, torch's random
functions record graph nodes and seed calls are refused (``fxmobile.capture.random_calls``); a
refusal (``RefusedError``) ends the search, since no other route can take the model either.
Hooks traced into the graph (``fxmobile.capture.hooks``) run in every route, and in every route
item assignment (``y[:, 0] = c``, which ``torch.fx``'s proxies refuse) is recorded as an
``operator.setitem`` node: a write every pass sees (``fxmobile.ops`` reads it as
``index_put_``), and TorchScript compiles as the same assignment.
"""

from __future__ import annotations

import contextlib
import operator
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from fxmobile.capture.hook_watch import watch_hook_registration
from fxmobile.capture.hooks import RootHooks, run_forward_hooks, run_pre_hooks
from fxmobile.capture.random_calls import recording_random_calls
from fxmobile.capture.shapes import RootForward, ShapedProxy, ShapeTracer, parameter_inputs
from fxmobile.errors import RefusedError, innermost_user_frame
from fxmobile.options import Options


class WritableProxy(fx.Proxy):
    """A proxy that records item assignment: ``y[key] = value`` -> ``operator.setitem(y, key,
    value)`` (``key`` may hold slices, ints, None, Ellipsis, proxies). Its attributes
    (``y.mT``) record it too."""

    def __setitem__(self, key: Any, value: Any) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})

    def __getattr__(self, name: str) -> Any:
        return WritableAttribute(self, name)


class WritableAttribute(fx.proxy.Attribute, WritableProxy):
    """``fx``'s lazily recorded attribute of a proxy, taking item assignment as well."""


class ShapedWritableProxy(ShapedProxy, WritableProxy):
    """A shape-aware proxy that records item assignment."""


class Tracer(fx.Tracer):
    """A tracer that honours user leaves, runs traced hooks, and remembers which submodule it
    was inside when tracing failed."""

    def __init__(
        self,
        leaf_types: tuple[type[nn.Module], ...],
        leaf_paths: set[str],
        record_frames: bool = False,
        traced_hooks: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__()
        self.leaf_types = leaf_types
        self.leaf_paths = leaf_paths
        self.traced_hooks = traced_hooks  # ids of the modules whose hooks run on the proxies
        self.failed_path: str | None = None
        # the user's source line of each node, by node name (only to explain a refusal)
        self.record_frames = record_frames
        self.frames: dict[str, str] = {}

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        with recording_random_calls(self):
            return super().trace(root, concrete_args)

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        if self.record_frames:
            where = innermost_user_frame(traceback.extract_stack())
            if where:
                self.frames[node.name] = where
        return node

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return WritableProxy(node, self)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaf_paths or isinstance(m, self.leaf_types):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(
        self, m: nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        try:
            if id(m) not in self.traced_hooks:
                return super().call_module(m, forward, args, kwargs)
            # The hooks run here, on the proxies, as Module.__call__ would run them; the module
            # itself is then called without them (fx's ``forward`` would run them again).
            args, kwargs = run_pre_hooks(m, args, kwargs)
            result = super().call_module(m, m.forward, args, kwargs)
            return run_forward_hooks(m, args, kwargs, result)
        except Exception:
            if self.failed_path is None:
                self.failed_path = self.path_of_module(m)
            raise


class ShapedTracer(ShapeTracer, Tracer):
    """``Tracer`` whose proxies carry fake tensors (``fxmobile.capture.shapes``).

    While a fake value is computed (``computing``), torch.fx's patches stay out of the way:
    a module's attributes are its real tensors and its submodules run as eager code, so the
    computation records nothing in the graph.
    """

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return ShapedWritableProxy(node, self)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self.computing:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def call_module(
        self, m: nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self.computing:
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def create_proxy(
        self,
        kind: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None = None,
        type_expr: Any = None,
        proxy_factory_fn: Any = None,
    ) -> fx.Proxy:
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        self.attach_meta(proxy, kind, target, args, kwargs)
        return proxy


@dataclass
class Traced:
    """A graph, the tracer that made it, and how it was made."""

    graph: fx.Graph
    tracer: Tracer
    route: str  # "plain", "shape-aware"
    auto_leaves: list[str] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)  # earlier routes and why they failed
    bound: list[str] = field(default_factory=list)  # how the example inputs bound (shape-aware)
    guards: dict[str, tuple[int, ...]] = field(default_factory=dict)  # input -> its shape


class TraceFailedError(Exception):
    """Every route failed; ``error`` is the last route's exception, ``path`` its submodule."""

    def __init__(self, error: Exception, path: str | None, declined: list[str]) -> None:
        super().__init__(str(error))
        self.error, self.path, self.declined = error, path, declined


def trace_model(
    model: nn.Module,
    options: Options,
    leaf_types: tuple[type[nn.Module], ...],
    leaf_paths: set[str],
    traced_hooks: frozenset[int],
) -> Traced:
    """Trace ``model`` (fxmobile's copy) by the first route that works; ``TraceFailedError`` when
    none does."""
    concrete = dict(options.concrete_args) if options.concrete_args else None
    shaped = options.example_inputs is not None
    declined: list[str] = []
    attempts = [False, True] if shaped else [False]
    last: tuple[Exception, str | None] | None = None
    for use_shapes in attempts:
        tracer = _tracer(use_shapes, leaf_types, set(leaf_paths), traced_hooks)
        try:
            with _undone_on_failure(model):
                traced = _trace_once(model, options, tracer, concrete, traced_hooks)
        except RefusedError:
            raise
        except Exception as exc:
            declined.append(f"{_route(use_shapes)} tracing failed: {_first_line(exc)}")
            last = (exc, tracer.failed_path)
            continue
        traced.declined = declined
        return traced
    paths, auto = set(leaf_paths), []
    while options.auto_leaf:
        tracer = _tracer(shaped, leaf_types, paths, traced_hooks)
        try:
            with _undone_on_failure(model):
                traced = _trace_once(model, options, tracer, concrete, traced_hooks)
        except RefusedError:
            raise
        except Exception as exc:
            path = tracer.failed_path
            last = (exc, path)
            if path and path not in paths:
                paths.add(path)
                auto.append(path)
                continue
            break
        traced.auto_leaves, traced.declined = auto, declined
        return traced
    assert last is not None
    raise TraceFailedError(last[0], last[1], declined)


@contextlib.contextmanager
def _undone_on_failure(model: nn.Module) -> Iterator[None]:
    """A failed attempt leaves nothing on ``model``: torch.fx stores each tensor constant it
    meets as a new root attribute (``_tensor_constant0``) while tracing, and capture would take
    one left by a failed route for a change the model's forward made."""
    before = set(vars(model))
    try:
        yield
    except BaseException:
        for name in set(vars(model)) - before:
            delattr(model, name)
        raise


def _route(shaped: bool) -> str:
    return "shape-aware" if shaped else "plain"


def _first_line(exc: Exception) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"


def _tracer(
    shaped: bool, leaf_types: tuple[type[nn.Module], ...], paths: set[str], hooks: frozenset[int]
) -> Tracer:
    cls = ShapedTracer if shaped else Tracer
    return cls(leaf_types, paths, traced_hooks=hooks)


def _trace_once(
    model: nn.Module,
    options: Options,
    tracer: Tracer,
    concrete: dict[str, Any] | None,
    traced_hooks: frozenset[int],
) -> Traced:
    root_hooks = id(model) in traced_hooks
    if not isinstance(tracer, ShapedTracer):
        hooks = RootHooks(model) if root_hooks else contextlib.nullcontext()
        with hooks, watch_hook_registration():
            graph = tracer.trace(model, concrete_args=concrete)
        return Traced(graph, tracer, "plain")
    inputs, fixed, bound = parameter_inputs(model.forward, options.example_inputs or ())
    for name, value in (concrete or {}).items():
        if value is not fx.PH:
            fixed[name] = value
            inputs.pop(name, None)
    tracer.start(inputs)
    with _root_forward(model, list(inputs), fixed, root_hooks), watch_hook_registration():
        graph = tracer.trace(model)
    guards = {
        name: tuple(meta.shape)
        for name, meta in tracer.placeholder_metas.items()
        if isinstance(meta, torch.Tensor)
    }
    return Traced(graph, tracer, "shape-aware", bound=bound, guards=guards)


@contextlib.contextmanager
def _root_forward(
    model: nn.Module, names: list[str], fixed: dict[str, Any], hooks: bool
) -> Iterator[None]:
    with RootForward(model, names, fixed, hooks):
        yield
