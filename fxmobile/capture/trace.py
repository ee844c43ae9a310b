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
import time
import typing
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx, nn

from fxmobile.capture.checks import (
    deep_copy,
    eager_arguments,
    resolve_leaves,
    training_submodules,
)
from fxmobile.capture.hook_watch import watch_hook_registration
from fxmobile.capture.hooks import (
    plan_hooks,
    refuse_global_hooks,
    refuse_untraceable_root_hooks,
    without_hooks,
)
from fxmobile.capture.mutation import (
    GraphWrite,
    StateChange,
    StateSnapshot,
    WriteSeenError,
    WriteWatch,
    fx_constants,
    graph_writes,
    owner_name,
)
from fxmobile.capture.parametrize import bake_parametrizations, recomputed_by_hooks
from fxmobile.capture.tracing import ShapedTracer, Traced, TraceFailedError, Tracer, trace_model
from fxmobile.errors import CaptureError, InvalidValueError, user_frame
from fxmobile.options import Options
from fxmobile.report.records import HookRecord
from fxmobile.verify import (
    check_input_writes,
    clone_inputs,
    compare_outputs,
    describe,
    reference_outputs,
)

__all__ = ["Capture", "capture"]


@dataclass(frozen=True)
class Capture:
    """The traced copy, and what capture had to do to get it.

    ``eager_copy`` is the deep copy that was traced (its parametrizations baked); the graph
    module shares its submodules, except where it calls a copy without the hooks it traced.
    """

    graph_module: fx.GraphModule
    eager_copy: nn.Module
    auto_leaves: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    # eager's outputs on the example inputs, taken before capture changed the copy (None
    # unless options.checks), and how long that run took
    reference: Any = None
    reference_seconds: float = 0.0
    hooks: tuple[HookRecord, ...] = ()
    parametrizations: dict[str, int] = field(default_factory=dict)
    route: str = "torch.fx"
    declined: tuple[str, ...] = ()


def capture(model: nn.Module, options: Options) -> Capture:
    """Trace a deep copy of ``model`` with ``torch.fx``; ``model`` has passed ``admit``.

    ``options.leaf_modules`` (classes, submodule instances of ``model`` or qualified names) are
    kept as opaque calls; ``options.eval_copy`` puts the copy (never ``model``) in eval mode.
    With ``options.checks``, eager's outputs are taken on the copy first, before capture bakes
    its parametrizations (``fxmobile.capture.parametrize``) or traces its hooks
    (``fxmobile.capture.hooks``): the check then compares against the model as the user has it.
    """
    refuse_global_hooks()
    refuse_untraceable_root_hooks(model)
    notes: list[str] = []
    leaf_types, leaf_paths = resolve_leaves(model, options.leaf_modules)
    concrete_args = dict(options.concrete_args) if options.concrete_args else None
    copied = deep_copy(model)
    training = training_submodules(copied)
    if training:
        notes.append(f"put fxmobile's copy in eval mode ({len(training)} modules were training)")
    copied.eval()  # modules whose forward ignores the flag compute the same either way

    reference, after_reference, seconds = None, (), 0.0
    if options.checks:
        before = StateSnapshot.of(copied)
        start = time.perf_counter()
        with watch_hook_registration(refuse=False) as registered:
            reference, after_reference = _reference_run(copied, options)
        seconds = time.perf_counter() - start
        if registered:
            raise CaptureError(
                f"{type(model).__name__}'s forward installs forward hooks when it runs "
                f"({registered[0]}, {len(registered)} in all): torch.fx does not run hooks, so a "
                "traced graph would read what they collect at trace time, empty. Fix: "
                "fxmobile.optimize traces it with torch.jit.trace instead (it runs the hooks); "
                "optimize_fx cannot capture it"
            )
        changes = before.changes(copied, recomputed=recomputed_by_hooks(copied))
        if changes:
            writes = _traced_writes(model, leaf_types, leaf_paths, concrete_args)
            where = _locate_write(model, leaf_types, leaf_paths, concrete_args, changes, writes)
            raise _mutation_error(model, changes, writes, where)
    baked = bake_parametrizations(copied)
    plan = plan_hooks(copied)
    leaf_paths |= plan.kept
    traced = frozenset(plan.traced)

    before = StateSnapshot.of(copied)
    try:
        traced_graph = trace_model(copied, options, leaf_types, leaf_paths, traced)
    except TraceFailedError as failed:
        raise _capture_error(copied, failed.path, failed.error, options.auto_leaf) from failed.error
    graph, tracer = traced_graph.graph, traced_graph.tracer
    changes = before.changes(copied, fx_constants(graph))
    writes = [replace(w, attribute=owner_name(copied, w.attribute)) for w in graph_writes(graph)]
    if changes or writes:
        where = _locate_write(model, leaf_types, leaf_paths, concrete_args, changes, writes)
        raise _mutation_error(model, changes, writes, where)
    notes += _route_notes(traced_graph)
    _refuse_none_output(model, graph)
    name = type(model).__name__
    gm = fx.GraphModule(tracer.root, graph, class_name=name)
    _call_unhooked_copies(gm, plan.traced)
    if concrete_args and traced_graph.route == "plain":
        _bake_concrete_args(gm, copied, concrete_args)
    if isinstance(tracer, ShapedTracer) and tracer.specialized:
        guard_input_shapes(gm, traced_graph.guards)
    _resolve_string_annotations(gm, copied)
    if reference is not None:
        args, _ = eager_arguments(copied, options.example_inputs or (), options.specialized_args)
        check_input_writes(gm, name, args, after_reference)
        if plan.kept:
            _check_kept_hooks_feed_nothing(gm, name, args, reference, options.tolerance, plan.kept)
    return Capture(
        gm,
        copied,
        tuple(traced_graph.auto_leaves),
        tuple(notes),
        reference,
        seconds,
        tuple(plan.records),
        dict(baked),
        "torch.fx" if traced_graph.route == "plain" else "torch.fx (shape-aware)",
        tuple(traced_graph.declined),
    )


def _check_kept_hooks_feed_nothing(
    gm: fx.GraphModule,
    name: str,
    args: tuple[Any, ...],
    reference: Any,
    tolerance: float,
    kept: set[str],
) -> None:
    """Run ``gm`` once and compare it with eager's ``reference``: a kept hook runs only when the
    graph runs, so what it collects for the model's own forward to read (transformers' output
    recorders once installed) was empty when torch.fx traced that read. CaptureError when the
    graph fails or differs; a graph without kept hooks is not run here."""
    try:
        with torch.no_grad():
            actual = gm(*clone_inputs(args))
        bad = [c for c in compare_outputs(reference, actual, tolerance) if not c.passed]
    except Exception as exc:
        failure = f"the graph fails on the example inputs ({type(exc).__name__}: {exc})"
    else:
        if not bad:
            return
        failure = f"the graph's output differs from eager's ({describe(bad[0])})"
    names = sorted(kept)
    modules = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise CaptureError(
        f"{name} keeps hooked modules ({modules}) called through __call__, so their hooks run "
        f"only when the graph runs, and {failure.splitlines()[0]}: the forward reads something "
        f"those hooks collect, which torch.fx saw empty. Fix: fxmobile.optimize traces it with "
        f"torch.jit.trace instead (it runs the hooks); optimize_fx cannot capture it"
    )


def _route_notes(traced: Traced) -> list[str]:
    """What the report says about how the graph was traced."""
    notes = []
    if traced.route == "shape-aware":
        tracer = traced.tracer
        assert isinstance(tracer, ShapedTracer)
        how = "; ".join(traced.bound)
        notes.append(
            "captured shape-aware, with the example inputs' shapes" + (f" ({how})" if how else "")
        )
        if tracer.specialized:
            shapes = ", ".join(f"{k} {list(v)}" for k, v in traced.guards.items())
            notes.append(
                f"specialized to the example inputs' shapes ({len(tracer.specialized)} shape "
                f"questions answered); the optimized module checks that its inputs have them: "
                f"{shapes}"
            )
    if traced.auto_leaves:
        leaves = ", ".join(traced.auto_leaves)
        notes.append(f"kept as opaque leaves because they do not trace: {leaves}")
    return notes


def guard_input_shapes(gm: fx.GraphModule, shapes: dict[str, tuple[int, ...]]) -> None:
    """``torch._assert`` at the start of the graph that each input has its specialized shape
    (one assert per dimension: comparisons of ints behave alike in Python and TorchScript)."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not placeholders:
        return
    anchor = placeholders[-1]
    for node in placeholders:
        shape = shapes.get(str(node.target))
        if shape is None:
            continue
        expected = "x".join(str(d) for d in shape) or "a scalar"
        message = (
            f"fxmobile specialized this model to input {node.target!r} of shape {expected} "
            f"(its example input's); other shapes need another optimization"
        )
        with graph.inserting_after(anchor):
            checks = [graph.call_method("dim", (node,))]
            checks += [graph.call_method("size", (node, i)) for i in range(len(shape))]
        values = [len(shape), *shape]
        for check, value in zip(checks, values, strict=True):
            with graph.inserting_after(check):
                equal = graph.call_function(operator.eq, (check, value))
            with graph.inserting_after(equal):
                anchor = graph.call_function(torch._assert, (equal, message))
    gm.recompile()


def _reference_run(model: nn.Module, options: Options) -> tuple[Any, tuple[Any, ...]]:
    """Eager's outputs on the example inputs, and the inputs as the call left them."""
    args, kwargs = eager_arguments(model, options.example_inputs or (), options.specialized_args)
    return reference_outputs(model, type(model).__name__, args, kwargs)


def _call_unhooked_copies(gm: fx.GraphModule, traced: dict[int, nn.Module]) -> None:
    """Leaf calls of modules whose hooks were traced call a copy without them."""
    for node in gm.graph.nodes:
        if node.op == "call_module" and id(gm.get_submodule(node.target)) in traced:
            gm.add_submodule(str(node.target), without_hooks(gm.get_submodule(node.target)))


def _refuse_none_output(model: nn.Module, graph: fx.Graph) -> None:
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    if output.args and output.args[0] is None:
        name = type(model).__name__
        raise InvalidValueError(
            f"{name}.forward returns None, so the optimized model would compute nothing "
            f"(fxmobile removes work whose result is unused). Fix: return the output tensor(s) "
            f"from {name}.forward (is a `return` missing?)."
        )


def _traced_writes(
    model: nn.Module,
    leaf_types: tuple[type[nn.Module], ...],
    leaf_paths: set[str],
    concrete_args: dict[str, Any] | None,
) -> list[GraphWrite]:
    """The in-place writes to module state a trace of a fresh copy records (for a refusal
    found by running the model: the message then names the op that writes)."""
    try:
        fresh = copy.deepcopy(model).eval()
        graph = Tracer(leaf_types, set(leaf_paths)).trace(fresh, concrete_args=concrete_args)
    except Exception:
        return []
    return [replace(w, attribute=owner_name(fresh, w.attribute)) for w in graph_writes(graph)]


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
        tracer = Tracer(leaf_types, set(leaf_paths), record_frames=True)
        with WriteWatch(tensors):
            tracer.trace(fresh, concrete_args=concrete_args)
    except WriteSeenError as seen:
        return user_frame(seen)
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


def _capture_error(
    root: nn.Module, path: str | None, exc: Exception, auto_leaf: bool
) -> CaptureError:
    """Name the submodule and line; the fix depends on whether fx met control flow on a traced
    value (``TraceError``) or forward raised an ordinary Python error while being traced."""
    where = user_frame(exc)
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
