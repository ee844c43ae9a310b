"""Turning the FX result into TorchScript: script it, or trace it when scripting fails.

``torch.jit.script`` is tried first because it keeps control flow. FX writes the original
forward's return annotation into the generated code, which breaks scripting when the eager
forward was annotated with a type it does not return in eval mode (torchvision's googlenet and
inception_v3 annotate a namedtuple and return a tensor): the annotation is dropped, and
TorchScript infers the return type. When scripting still fails and example inputs were given,
the module is traced instead and the report says so.

Tracing (``_trace``) runs the module as every other run in fxmobile does: under ``no_grad``
(with autograd on, a write through a ``chunk`` / ``split`` / ``unbind`` view raises) and on
clones of the example inputs (a forward may write to its input; the caller's are never
written). ``torch.jit.trace`` returns NamedTuples as plain tuples, so a module returning one is
traced with its outputs flattened and wrapped in a scripted module that builds the NamedTuple
again (TorchScript's copy of the class, as a scripted module returns). A dataclass output
cannot come back from TorchScript as the user's class: ``ScriptingError``, naming it.

The FX stage's last pass (``fxmobile.passes.inline_modules``) has written calls to standard leaf
modules out as the functions their ``forward`` calls: TorchScript then compiles one method
instead of one type per submodule, and freezing has nothing to inline.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import operator
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import TensorMetadata
from torch.utils import _pytree as pytree

from fxmobile import ops
from fxmobile.capture.checks import deep_copy
from fxmobile.capture.hooks import hook_kinds
from fxmobile.errors import InvalidValueError, ScriptingError
from fxmobile.passes.graph_utils import tensor_meta
from fxmobile.script.remove_dropout import remove_identity_dropouts
from fxmobile.verify import clone_inputs, compare_outputs, same_values


def quietly_script(module: torch.nn.Module) -> torch.jit.ScriptModule:
    """``torch.jit.script`` without its deprecation warning: fxmobile needs TorchScript.

    The result shares compiled types (and so method graphs) with every other scripted
    instance of the same classes: never rewrite its graphs in place before freezing, which
    gives the frozen module types of its own.
    """
    store = torch.jit._recursive.concrete_type_store
    before = {cls: list(types) for cls, types in store.type_store.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script. is deprecated")
        # about how the TorchScript frontend reads some torchvision __init__ annotations
        warnings.filterwarnings("ignore", message="The TorchScript type system doesn't support")
        try:
            return torch.jit.script(module)
        except Exception:
            # torch keeps the types this attempt made, their methods half defined: scripting
            # an equal module again then fails with "Can't redefine method: forward" instead
            # of the real error (found by the fuzzer). Forget the ones it did not finish.
            for cls, types in store.type_store.items():
                kept = before.get(cls, [])
                store.type_store[cls] = [
                    t for t in types if t in kept or t in store.methods_compiled
                ]
            raise


def clone_script_module(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """A copy of the module's state (attributes, training flags); it shares the types."""
    return copy.deepcopy(module)


def _alias_aware_type_as(gm: fx.GraphModule) -> bool:
    """``a.type_as(b)`` -> ``a.to(b)``: the same op (dtype and device of ``b``), but
    TorchScript's schema for ``type_as`` calls its result fresh, although it is ``a`` itself when
    nothing converts, so TorchScript removed a write through it as dead code; ``to`` carries the
    alias annotation. Whether it changed a node."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_method" and node.target == "type_as" and len(node.args) == 2:
            node.target = "to"
            changed = True
    return changed


def _scriptable_empty_index(gm: fx.GraphModule) -> bool:
    """``x[()]`` -> ``aten::alias(x)``: the op ATen's indexing runs for an empty index (a view of
    the whole tensor), which TorchScript cannot compile as an index ("unsupported index type
    'Tuple[()]'"); without it such a graph went to torch.jit.trace. Whether it changed a node."""
    changed = False
    for node in gm.graph.nodes:
        if (
            node.op == "call_function"
            and node.target is operator.getitem
            and node.args[1] == ()
            and _is_tensor(node.args[0])
        ):
            node.target, node.args = torch.ops.aten.alias, (node.args[0],)
            changed = True
    return changed


def _is_tensor(arg: Any) -> bool:
    """Whether shape propagation saw a tensor in ``arg`` (``d[()]`` is a key on a dict)."""
    return isinstance(arg, fx.Node) and isinstance(tensor_meta(arg), TensorMetadata)


def _drop_return_annotation(gm: fx.GraphModule) -> bool:
    """Whether the output node had a type annotation (now dropped)."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "output" and node.type is not None:
            node.type = None
            changed = True
    return changed


def to_torchscript(
    gm: fx.GraphModule, example_inputs: tuple[Any, ...] | None
) -> tuple[torch.jit.ScriptModule, str | None]:
    """A ``ScriptModule`` for ``gm``, and a note when it had to be traced instead of scripted
    (a trace that does not replay ``gm`` on the example inputs raises ``ScriptingError``)."""
    # each rewrite runs (no short-circuit), and the code is generated again once, if needed
    if any([_drop_return_annotation(gm), _alias_aware_type_as(gm), _scriptable_empty_index(gm)]):
        gm.recompile()
    try:
        return quietly_script(gm), None
    except Exception as exc:
        reason = str(exc).strip().splitlines()
        first = _with_hooks_named(gm, reason[0] if reason else type(exc).__name__)
        if example_inputs is None:
            raise ScriptingError(
                f"torch.jit.script could not compile the optimized {type(gm).__name__}: "
                f"{exc}\nFix: pass example_inputs so fxmobile can trace it instead, or mark the "
                f"submodule named above as a leaf and make it scriptable."
            ) from exc
    partly = _script_with_traced_hooked_leaves(gm, example_inputs)
    if partly is not None:
        scripted, names = partly
        return scripted, (
            f"scripting failed ({first}); the hooked module{'s' if len(names) > 1 else ''} "
            f"{', '.join(names)} traced with the example inputs (the hooks run at trace time), "
            f"the rest scripted"
        )
    traced, warned, reference = _trace(gm, example_inputs)
    if not _replays(traced, reference, example_inputs):
        raise ScriptingError(
            f"torch.jit.script could not compile the optimized {type(gm).__name__} ({first}), "
            f"and its torch.jit.trace computes something else than the optimized graph on the "
            f"example inputs (the tracer does not record every op: a write through .data is "
            f"one). Fix: write the value without .data, or make the hooks and submodules named "
            f"above scriptable."
        )
    depends = "".join(f"torch.jit.trace warned: {w}; " for w in warned)
    note = (
        f"scripting failed ({first}); {depends}traced with the example inputs instead, so "
        f"control flow is fixed to the path those inputs took"
    )
    return traced, note


def _with_hooks_named(gm: fx.GraphModule, first: str) -> str:
    """torch's first line, after the hooks TorchScript cannot compile (any but a plain function:
    a callable object, a bound method, a ``functools.partial``), named with their modules: its
    own message names neither ("'Recorder' object has no attribute '__name__'")."""
    hooks = [
        f"{path}'s {kind} ({_hook_label(hook)})"
        for path, module in gm.named_modules()
        if path
        for kind, hook in hook_kinds(module)
        if not inspect.isfunction(hook)
    ]
    if not hooks:
        return first
    return f"TorchScript compiles plain-function hooks only, not {', '.join(hooks)}: {first}"


def _hook_label(hook: Any) -> str:
    if inspect.ismethod(hook):
        return f"the bound method {hook.__qualname__}"
    if isinstance(hook, functools.partial):
        return "a functools.partial"
    return f"a {type(hook).__qualname__} object"


def _script_with_traced_hooked_leaves(
    gm: fx.GraphModule, example_inputs: tuple[Any, ...]
) -> tuple[torch.jit.ScriptModule, list[str]] | None:
    """``gm`` scripted with each hooked module it calls (capture keeps those as calls through
    ``__call__``) traced on its own, hooks included; None when that does not script.

    A hook TorchScript cannot compile (a recorder object) is what usually stops scripting, and
    tracing the whole module would record only the tensor ops it sees: a write through ``.data``,
    for one, is not among them. Each hooked module is traced with the arguments it got on a run
    of ``gm`` on the example inputs; a module called more than once, or with keyword arguments,
    is not (the whole module is traced instead)."""
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_module"]
    hooked = [t for t in dict.fromkeys(targets) if ops.has_hooks(gm.get_submodule(t))]
    if not hooked or any(targets.count(t) > 1 for t in hooked):
        return None
    calls: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    handles = []
    for target in hooked:

        def record(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], target: str = target
        ) -> None:
            calls[target] = (clone_inputs(args), kwargs)

        module = gm.get_submodule(target)
        handles.append(module.register_forward_pre_hook(record, prepend=True, with_kwargs=True))
    try:
        with torch.no_grad():
            gm(*clone_inputs(example_inputs))
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
    if set(calls) != set(hooked) or any(kwargs for _, kwargs in calls.values()):
        return None
    partly = copy.copy(gm)
    partly._modules = dict(gm._modules)
    try:
        for target in hooked:
            traced, warned, _ = _trace(gm.get_submodule(target), calls[target][0])
            if warned:  # the trace may hold only what the example decided
                return None
            _set_submodule(partly, target, traced)
        return quietly_script(partly), hooked
    except Exception:
        return None


def _set_submodule(root: nn.Module, target: str, module: nn.Module) -> None:
    """``root``'s submodule at ``target`` replaced by ``module``, copying each parent on the
    path so the module ``root`` was copied from keeps its own."""
    *parents, leaf = target.split(".")
    owner = root
    for name in parents:
        child = copy.copy(owner.get_submodule(name))
        child._modules = dict(child._modules)
        owner._modules[name] = child
        owner = child
    owner._modules[leaf] = module


@dataclass
class Fallback:
    """A model torch.fx could not capture, as TorchScript, and how it was made."""

    module: torch.jit.ScriptModule
    route: str  # "torch.jit.trace" or "torch.jit.script"
    declined: list[str]  # routes tried before and why they were not taken
    notes: list[str]  # what the route fixed in place (torch's tracer warnings)


def fallback_to_torchscript(model: nn.Module, example_inputs: tuple[Any, ...] | None) -> Fallback:
    """``model`` (a fresh copy of it, in eval mode) as TorchScript without torch.fx.

    With example inputs ``torch.jit.trace`` comes first: it runs the model's Python, whatever
    it is, and records the tensor ops that ran. When torch's tracer warns (each of its warnings
    says the recording may hold what the example's values decided: a branch on a tensor,
    ``.item()``, ``resize_``) or the trace does not replay forward, ``torch.jit.script``, which
    keeps control flow, is tried; if it fails too, a trace that replays is taken with its
    warnings in the notes, and one that does not is refused. Without example inputs only
    ``torch.jit.script`` can run.
    """
    declined: list[str] = []
    if example_inputs is not None:
        traced, warned, reference = _trace(deep_copy(model).eval(), example_inputs)
        replays = _replays(traced, reference, example_inputs)
        if not warned and replays:
            notes = ["torch.jit.trace fixed shapes and control flow to the example inputs'"]
            return Fallback(traced, "torch.jit.trace", declined, notes)
        try:
            return Fallback(
                quietly_script(deep_copy(model).eval()), "torch.jit.script", declined, []
            )
        except Exception as exc:
            declined.append(f"torch.jit.script failed: {_first_line(exc)}")
        if not replays:
            raise ScriptingError(
                f"neither torch.fx nor torch.jit.script could capture {type(model).__name__} "
                f"({'; '.join(declined)}), and its torch.jit.trace computes something else "
                f"than forward on the example inputs (the tracer does not record every op: "
                f"a write through .data is one). Fix: write the value without .data, or make "
                f"forward scriptable."
            )
        notes = [f"torch.jit.trace warned: {w}" for w in warned]
        notes.append(
            "torch.jit.trace fixed the branches the example inputs took: other inputs may take "
            "others, which the optimized module does not have"
        )
        return Fallback(traced, "torch.jit.trace", declined, notes)
    try:
        return Fallback(quietly_script(deep_copy(model).eval()), "torch.jit.script", declined, [])
    except Exception as exc:
        raise ScriptingError(
            f"neither torch.fx nor torch.jit.script could capture {type(model).__name__} "
            f"({_first_line(exc)}). Fix: pass example_inputs, so fxmobile can trace it with "
            f"torch.jit.trace and check the result."
        ) from exc


def _replays(traced: torch.jit.ScriptModule, reference: nn.Module, inputs: tuple[Any, ...]) -> bool:
    """Whether ``traced`` returns what ``reference`` (``_trace``'s copy of the model, called
    once, as the traced module's state was while it was traced: a counter, a cache) returns on
    its next call, within 1e-5 of each output's scale, and leaves its inputs as that call does:
    the tracer records only the ops it sees (a write through ``.data`` is not one), and drops
    a write it thinks no one reads (through an eval-mode dropout's result, whose schema says
    it is fresh). Both calls draw from the same random seed, so a model that samples noise
    replays too."""
    expected_inputs, got_inputs = clone_inputs(inputs), clone_inputs(inputs)
    try:
        with torch.random.fork_rng(), torch.no_grad():
            torch.manual_seed(0)
            expected = reference(*expected_inputs)
            torch.manual_seed(0)
            got = traced(*got_inputs)
        checks = compare_outputs(expected, got, 1e-5)
    except InvalidValueError:  # another structure, or another shape
        return False
    written_alike = all(
        same_values(a, b)
        for a, b in zip(
            pytree.tree_leaves(expected_inputs), pytree.tree_leaves(got_inputs), strict=True
        )
        if isinstance(a, torch.Tensor)
    )
    return written_alike and all(check.passed for check in checks)


def _trace(
    model: nn.Module, inputs: tuple[Any, ...]
) -> tuple[torch.jit.ScriptModule, list[str], nn.Module]:
    """``torch.jit.trace`` of ``model`` under ``no_grad`` on clones of ``inputs``, its output
    structure kept (``_Regroup``), torch's tracer warnings, and the copy of ``model`` whose
    first call gave the output structure (for ``_replays``)."""
    name = type(model).__name__
    reference = deep_copy(model)
    with torch.no_grad():  # on a copy: a forward that fills a cache must trace its first call
        outputs = reference(*clone_inputs(inputs))
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
            traced = torch.jit.trace(
                traced_module, clone_inputs(inputs), check_trace=False, strict=False
            )
        except Exception as exc:
            raise ScriptingError(
                f"torch.jit.trace could not trace the optimized {name}: {_first_line(exc)}. "
                f"Fix: make forward scriptable (torch.jit.script), or return tensors, or "
                f"tuples, lists or dicts of them."
            ) from exc
    found = [str(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    _drop_identity_dropouts(traced)
    if regroup:
        traced = _regroup(traced, len(inputs), leaves, spec, name)
    return traced, list(dict.fromkeys(found)), reference


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
            f"them again: {_first_line(exc)}. Fix: annotate the NamedTuple's fields "
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


def _first_line(exc: Exception) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"
