"""``torch.jit.trace`` as fxmobile runs it, and the replay that vouches for a trace.

Tracing (``trace``) runs the module as every other run in fxmobile does: under ``no_grad``
(with autograd on, a write through a ``chunk`` / ``split`` / ``unbind`` view raises) and on
clones of the example inputs (a forward may write to its input; the caller's are never
written). A seed call (``torch.manual_seed``) is refused while it runs: the tracer records none
(``fxmobile.capture.random_calls``). ``torch.jit.trace`` returns NamedTuples as plain tuples, so
a module returning one is traced with its outputs flattened and wrapped in a scripted module
that builds the NamedTuple again (TorchScript's copy of the class, as a scripted module
returns). A dataclass output cannot come back from TorchScript as the user's class:
``ScriptingError``, naming it.

A trace holds the ops that ran on the example inputs, and nothing of the branches they did not
take. ``replays`` vouches for it: the trace must return what the model returns on the example
inputs and on the same inputs in other memory layouts (``fxmobile.capture.layouts``: the tracer
gives no warning for a branch on ``is_contiguous()`` or a stride), and leave its inputs as the
model does.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import warnings
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxmobile.capture.checks import deep_copy
from fxmobile.capture.layouts import other_layouts
from fxmobile.capture.random_calls import refusing_rng_state_calls
from fxmobile.errors import InvalidValueError, RefusedError, ScriptingError
from fxmobile.script.quiet_script import quietly_script
from fxmobile.script.remove_dropout import remove_identity_dropouts
from fxmobile.verify import clone_inputs, compare_outputs, same_values

EXAMPLE = "the example inputs"


def replays(
    traced: torch.jit.ScriptModule, model: nn.Module, inputs: tuple[Any, ...]
) -> str | None:
    """None when ``traced`` replays ``model`` (a copy of the model as it was before it was
    traced: ``trace`` gives one) on ``inputs`` and on each of their other layouts; else which
    inputs it did not replay on.

    For each inputs, a fresh copy of ``model`` is called on ``inputs`` once, as the traced
    module was while it was traced (a counter, a cache, a hook it installs), and then on them;
    a copy of ``traced`` must return what that second call returns, within 1e-5 of each
    output's scale, and leave the inputs as it does: the tracer records only the ops it sees (a
    write through ``.data`` is not one), drops a write it thinks no one reads (through an
    eval-mode dropout's result, whose schema says it is fresh), and keeps only the branches the
    example took. Both calls draw from the same random seed, so a model that samples noise
    replays too. A layout the model itself refuses is not tried, and the module handed back
    keeps its state: only copies run.
    """
    for label, variant in [(EXAMPLE, inputs), *other_layouts(inputs)]:
        expected_inputs, got_inputs = clone_inputs(variant), clone_inputs(variant)
        try:
            expected = _second_call(model, inputs, expected_inputs)
        except Exception:
            if label == EXAMPLE:
                raise
            continue  # eager refuses this layout: there is nothing to replay
        try:
            got = _seeded(copy.deepcopy(traced), got_inputs)
            checks = compare_outputs(expected, got, 1e-5)
        except (InvalidValueError, RuntimeError):  # another structure, shape, or a failure
            return label
        written_alike = all(
            same_values(a, b)
            for a, b in zip(
                pytree.tree_leaves(expected_inputs), pytree.tree_leaves(got_inputs), strict=True
            )
            if isinstance(a, torch.Tensor)
        )
        if not written_alike or not all(check.passed for check in checks):
            return label
    return None


def _second_call(model: nn.Module, first: tuple[Any, ...], second: tuple[Any, ...]) -> Any:
    """What a fresh copy of ``model`` returns on ``second`` after a call on ``first``."""
    fresh = deep_copy(model)
    with torch.no_grad():
        fresh(*clone_inputs(first))
    return _seeded(fresh, second)


def _seeded(module: Any, inputs: tuple[Any, ...]) -> Any:
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(0)
        return module(*inputs)


def trace(
    model: nn.Module, inputs: tuple[Any, ...]
) -> tuple[torch.jit.ScriptModule, list[str], nn.Module]:
    """``torch.jit.trace`` of ``model`` under ``no_grad`` on clones of ``inputs``, its output
    structure kept (``_regroup``), torch's tracer warnings, and a copy of ``model`` as it was
    before (for ``replays``)."""
    name = type(model).__name__
    before = deep_copy(model)
    # on a copy: a forward that fills a cache must trace its first call
    with torch.no_grad(), refusing_rng_state_calls(name):
        outputs = deep_copy(model)(*clone_inputs(inputs))
    leaves, spec = pytree.tree_flatten(outputs)
    for leaf in leaves:
        if dataclasses.is_dataclass(leaf):
            cls = type(leaf).__name__
            raise ScriptingError(
                f"the optimized {name} returns a dataclass ({cls}), and TorchScript cannot "
                f"compile it, so fxmobile traced it; a traced module cannot return a {cls} "
                f"either. Fix: return a tuple, dict or NamedTuple of tensors from forward."
            )
    regroup = _has_namedtuple(outputs)
    _second_names_as_attributes(model)
    traced_module = _Flatten(model) if regroup else model
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always", torch.jit.TracerWarning)
        try:
            with refusing_rng_state_calls(name):
                traced = torch.jit.trace(
                    traced_module, clone_inputs(inputs), check_trace=False, strict=False
                )
        except (ScriptingError, RefusedError):
            raise
        except Exception as exc:
            raise ScriptingError(
                f"torch.jit.trace could not trace the optimized {name}: {first_line(exc)}. "
                f"Fix: make forward scriptable (torch.jit.script), or return tensors, or "
                f"tuples, lists or dicts of them."
            ) from exc
    found = [str(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    _drop_identity_dropouts(traced)
    if regroup:
        traced = _regroup(traced, len(inputs), leaves, spec, name)
    return traced, list(dict.fromkeys(found)), before


def _drop_identity_dropouts(traced: torch.jit.ScriptModule) -> None:
    """Dropouts that return their input (``p`` 0, or ``train`` False) go from the trace's graphs
    before anything optimizes them. TorchScript's schema says a dropout returns a fresh tensor,
    so freezing's dead code elimination dropped an in-place write through one, even a write
    into the caller's input (found by the fuzzer). A trace's types are its own, so no other
    module shares these graphs."""
    for module in traced.modules():
        if not isinstance(module, torch.jit.ScriptModule) or not module._c._has_method("forward"):
            continue
        remove_identity_dropouts(module._c._get_method("forward").graph)


def _second_names_as_attributes(model: nn.Module) -> None:
    """On fxmobile's copy: a tensor a module registers under two names (tied weights, an alias
    kept for old checkpoints) stays registered under its first; the other names become plain
    attributes holding the same tensor. torch.jit.trace refuses a module whose parameters and
    buffers are not distinct ("TracedModules don't support parameter sharing between modules");
    traced, the attribute is read as a constant, which is what freezing makes every weight."""
    for module in model.modules():
        seen: set[int] = set()
        for store in (module._parameters, module._buffers):
            for name, tensor in list(store.items()):
                if tensor is None:
                    continue
                if id(tensor) in seen:
                    del store[name]
                    module.__dict__[name] = tensor
                seen.add(id(tensor))


def _has_namedtuple(value: Any) -> bool:
    if pytree.is_namedtuple(value):
        return True
    if isinstance(value, tuple | list):
        return any(_has_namedtuple(v) for v in value)
    return isinstance(value, dict) and any(_has_namedtuple(v) for v in value.values())


class _Flatten(nn.Module):
    """``inner``'s tensor outputs as one flat tuple (what ``torch.jit.trace`` keeps)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> tuple[torch.Tensor, ...]:
        leaves = pytree.tree_leaves(self.inner(*args))
        return tuple(t for t in leaves if isinstance(t, torch.Tensor))


def _regroup(
    traced: torch.jit.ScriptModule,
    n_inputs: int,
    leaves: list[Any],
    spec: pytree.TreeSpec,
    name: str,
) -> torch.jit.ScriptModule:
    """A scripted module calling ``traced`` (flat tensor outputs) and putting them back in the
    structure ``spec`` describes, NamedTuples included; non-tensor ``leaves`` as constants."""
    graph = fx.Graph()
    args = [graph.placeholder(f"input_{i}") for i in range(n_inputs)]
    flat = graph.call_module("traced", tuple(args))
    rebuilt: list[Any] = []
    index = 0
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            rebuilt.append(graph.call_function(operator.getitem, (flat, index)))
            index += 1
        else:
            rebuilt.append(leaf)
    graph.output(_construct(graph, pytree.tree_unflatten(rebuilt, spec)))
    root = nn.Module()
    root.traced = traced
    try:
        return quietly_script(fx.GraphModule(root, graph, class_name=name))
    except Exception as exc:
        raise ScriptingError(
            f"the optimized {name} was traced (TorchScript could not compile it), which returns "
            f"NamedTuples as plain tuples, and TorchScript could not compile a module building "
            f"them again: {first_line(exc)}. Fix: annotate the NamedTuple's fields "
            f"(typing.NamedTuple), or return a tuple or dict."
        ) from exc


def _construct(graph: fx.Graph, value: Any) -> Any:
    """``value`` with each NamedTuple in it built by a call of its class: torch.fx names the
    class in the code it writes for a NamedTuple in the output's tuples, but not in a dict's
    values ("undefined value Pair" when scripted)."""
    if pytree.is_namedtuple(value):
        return graph.call_function(type(value), tuple(_construct(graph, v) for v in value))
    if isinstance(value, tuple | list):
        return type(value)(_construct(graph, v) for v in value)
    if isinstance(value, dict):
        return {k: _construct(graph, v) for k, v in value.items()}
    return value


def first_line(exc: Exception) -> str:
    """``TypeName: first line of the message``."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"
