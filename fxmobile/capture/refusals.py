"""Capture's refusals once it has run or traced the model: each names the culprit and the fix.

A forward that changes the module's state (the line that does it is found by tracing a fresh
copy once more, watching the state), a graph that reads what kept hooks collect, a forward that
installs hooks, a submodule or forward torch.fx cannot trace.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import torch
from torch import fx, nn

from fxmobile.capture.mutation import (
    GraphWrite,
    StateChange,
    WriteSeenError,
    WriteWatch,
    graph_writes,
    owner_name,
)
from fxmobile.capture.tracing import Tracer
from fxmobile.errors import CaptureError, user_frame
from fxmobile.verify import clone_inputs, compare_outputs, describe


def hooks_installed_error(model: nn.Module, registered: list[str]) -> CaptureError:
    """A forward that installs forward hooks when it runs: torch.fx would not run them."""
    return CaptureError(
        f"{type(model).__name__}'s forward installs forward hooks when it runs "
        f"({registered[0]}, {len(registered)} in all): torch.fx does not run hooks, so a "
        "traced graph would read what they collect at trace time, empty. Fix: "
        "fxmobile.optimize traces it with torch.jit.trace instead (it runs the hooks); "
        "optimize_fx cannot capture it"
    )


def check_kept_hooks_feed_nothing(
    gm: fx.GraphModule,
    name: str,
    args: tuple[Any, ...],
    reference: Any,
    tolerance: float | None,
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


def traced_writes(
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


def locate_write(
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


def mutation_error(
    model: nn.Module, changes: list[StateChange], writes: list[GraphWrite], where: str | None
) -> CaptureError:
    """The refusal of a forward that changes the module's state (``changes``, found by
    running it or tracing it; ``writes``, recorded in the graph), at the user's line."""
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


def capture_error(
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
