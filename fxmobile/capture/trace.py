"""Capture: symbolic tracing of a deep copy of the user's module.

The user's module is never touched: it is deep-copied first, the copy is traced, and every later
stage works on that copy. When tracing fails, the error names the innermost submodule that was
being traced and the user's source line, and suggests the fix (a leaf module or concrete args).
With ``auto_leaf=True`` each submodule that fails to trace is kept opaque instead, and the
report lists them.

Before tracing, capture refuses what it cannot optimize faithfully (``fxmobile.capture.checks``)
and specializes the arguments left at None (``fxmobile.capture.graph_edits``). After tracing it
refuses a forward that changes the module's state outside a leaf (``fxmobile.capture.mutation``;
a leaf runs as eager code and keeps its state, which fxmobile's own runs leave as the caller has
it: ``fxmobile.capture.state``) or returns None; each refusal names the culprit and the fix
(``fxmobile.capture.refusals``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from torch import fx, nn

from fxmobile.capture.checks import (
    deep_copy,
    eager_arguments,
    resolve_leaves,
    training_submodules,
)
from fxmobile.capture.graph_edits import (
    bake_concrete_args,
    call_unhooked_copies,
    guard_input_shapes,
    left_at_none,
    none_note,
    refuse_none_output,
    resolve_string_annotations,
)
from fxmobile.capture.hook_watch import watch_hook_registration
from fxmobile.capture.hooks import plan_hooks, refuse_global_hooks, refuse_untraceable_root_hooks
from fxmobile.capture.mutation import (
    StateChange,
    StateSnapshot,
    fx_constants,
    graph_writes,
    owner_name,
)
from fxmobile.capture.parametrize import bake_parametrizations, recomputed_by_hooks
from fxmobile.capture.reference import Reference, eager_reference
from fxmobile.capture.refusals import (
    capture_error,
    check_kept_hooks_feed_nothing,
    hooks_installed_error,
    locate_write,
    mutation_error,
    traced_writes,
)
from fxmobile.capture.state import restore_changed, snapshot, state_kept
from fxmobile.capture.tracing import ShapedTracer, Traced, TraceFailedError, trace_model
from fxmobile.options import Options
from fxmobile.report.records import HookRecord
from fxmobile.verify import check_input_writes, seeded

__all__ = ["Capture", "capture", "guard_input_shapes"]


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
    # eager's outputs on each input set the gate checks, taken before capture changed the copy
    # (None unless options.checks), and how long those runs took
    reference: Reference | None = None
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
    nones = left_at_none(model, options)
    if nones:
        notes.append(none_note(nones, options))
        options = replace(options, concrete_args={**(options.concrete_args or {}), **nones})
    concrete_args = dict(options.concrete_args) if options.concrete_args else None
    copied = deep_copy(model)
    training = training_submodules(copied)
    if training:
        notes.append(f"put fxmobile's copy in eval mode ({len(training)} modules were training)")
    copied.eval()  # modules whose forward ignores the flag compute the same either way
    leaves = leaf_paths | {p for p, m in copied.named_modules() if p and isinstance(m, leaf_types)}

    reference, after_reference, seconds = None, (), 0.0
    written: list[StateChange] = []  # what eager's run changed outside the leaves
    if options.checks:
        start = time.perf_counter()
        with watch_hook_registration(refuse=False) as registered:
            reference, after_reference, written = _reference_run(model, copied, options)
        seconds = time.perf_counter() - start
        if registered:
            raise hooks_installed_error(model, registered)
        written = _outside(written, leaves)
        if written and not options.auto_leaf:  # no submodule can become a leaf: refuse now
            raise _state_error(model, leaf_types, leaf_paths, concrete_args, written)
    baked = bake_parametrizations(copied)
    plan = plan_hooks(copied)
    leaf_paths |= plan.kept
    traced = frozenset(plan.traced)

    before, stamps = StateSnapshot.of(copied), snapshot(copied)
    try:
        traced_graph = trace_model(copied, options, leaf_types, leaf_paths, traced)
    except TraceFailedError as failed:
        if written:
            raise _state_error(model, leaf_types, leaf_paths, concrete_args, written) from None
        raise capture_error(copied, failed.path, failed.error, options.auto_leaf) from failed.error
    graph, tracer = traced_graph.graph, traced_graph.tracer
    leaves |= plan.kept | set(traced_graph.auto_leaves)
    # a leaf run while tracing (on fake tensors, by the shape-aware tracer) keeps its state:
    # as the caller has it
    changes = _outside(before.changes(copied, fx_constants(graph)), leaves)
    writes = [replace(w, attribute=owner_name(copied, w.attribute)) for w in graph_writes(graph)]
    written = _outside(written, leaves)
    if written or changes or writes:
        changes = list({c.path: c for c in written + changes}.values())
        where = locate_write(model, leaf_types, leaf_paths, concrete_args, changes, writes)
        raise mutation_error(model, changes, writes, where)
    restore_changed(copied, model, stamps)
    notes += _route_notes(traced_graph)
    refuse_none_output(model, graph)
    name = type(model).__name__
    gm = fx.GraphModule(tracer.root, graph, class_name=name)
    call_unhooked_copies(gm, plan.traced)
    if concrete_args and traced_graph.route == "plain":
        bake_concrete_args(gm, copied, concrete_args)
    if isinstance(tracer, ShapedTracer) and tracer.specialized:
        guard_input_shapes(gm, traced_graph.guards)
    resolve_string_annotations(gm, copied)
    if reference is not None:
        args, _ = eager_arguments(copied, options.example_inputs or (), options.specialized_args)
        with state_kept(gm, model), seeded():
            check_input_writes(gm, name, args, after_reference)
        if plan.kept:
            with state_kept(gm, model), seeded():
                check_kept_hooks_feed_nothing(
                    gm, name, args, reference.example, options.tolerance, plan.kept
                )
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


def _reference_run(
    model: nn.Module, copied: nn.Module, options: Options
) -> tuple[Reference, tuple[Any, ...], list[StateChange]]:
    """Eager's outputs on each input set (``fxmobile.capture.reference``), run on ``copied``
    from ``model``'s state each time; the example inputs as the call left them; and the state
    the example's run changed (a forward that keeps state)."""
    before = StateSnapshot.of(copied)
    changed: list[StateChange] = []

    def after_example() -> None:
        changed.extend(before.changes(copied, recomputed=recomputed_by_hooks(copied)))

    def arguments(inputs: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return eager_arguments(copied, inputs, options.specialized_args)

    assert options.example_inputs is not None  # options.checks
    reference, after = eager_reference(
        copied, model, options.example_inputs, arguments, after_example=after_example
    )
    return reference, after, changed


def _outside(changes: list[StateChange], leaves: set[str]) -> list[StateChange]:
    """The changes to state that is not inside one of the ``leaves`` (qualified names)."""
    return [
        c
        for c in changes
        if not any(c.module_path == p or c.module_path.startswith(p + ".") for p in leaves)
    ]


def _state_error(
    model: nn.Module,
    leaf_types: tuple[type[nn.Module], ...],
    leaf_paths: set[str],
    concrete_args: dict[str, Any] | None,
    changes: list[StateChange],
) -> Exception:
    """The refusal of a forward whose run changed state outside the leaves, with the line."""
    writes = traced_writes(model, leaf_types, leaf_paths, concrete_args)
    where = locate_write(model, leaf_types, leaf_paths, concrete_args, changes, writes)
    return mutation_error(model, changes, writes, where)


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
