"""Into TorchScript: the FX result (``to_torchscript``), or the whole model where torch.fx could
not capture it (``fallback_to_torchscript``); scripted where that works, traced otherwise.

``torch.jit.script`` is tried first on the FX result because it keeps control flow. FX writes
the original forward's return annotation into the generated code, which breaks scripting when
the eager forward was annotated with a type it does not return in eval mode (torchvision's
googlenet and inception_v3 annotate a namedtuple and return a tensor): the annotation is
dropped, and TorchScript infers the return type. When scripting still fails and example inputs
were given, the hooked modules are traced alone (``fxmobile.script.hooked_leaves``), or the
whole module is (``fxmobile.script.jit_trace``), and the report says so. A trace is taken only
when it replays the module on the example inputs and on the same inputs in other memory layouts.

A seed call (``torch.manual_seed``) or a generator object in a scripted module is refused, as
every route refuses it (``fxmobile.capture.random_calls``).

The FX stage's last pass (``fxmobile.passes.inline_modules``) has written calls to standard leaf
modules out as the functions their ``forward`` calls: TorchScript then compiles one method
instead of one type per submodule, and freezing has nothing to inline.
"""

from __future__ import annotations

import copy
import functools
import inspect
import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import TensorMetadata

from fxmobile import ops
from fxmobile.capture.checks import deep_copy
from fxmobile.capture.hooks import hook_kinds
from fxmobile.capture.random_calls import generator_error, seed_call_error, unused_draw_error
from fxmobile.errors import ScriptingError
from fxmobile.passes.graph_utils import tensor_meta
from fxmobile.script.control_flow import branches_on_inputs, frozen_forward, source_line
from fxmobile.script.hooked_leaves import script_with_traced_hooked_leaves
from fxmobile.script.jit_trace import EXAMPLE, first_line, replays, trace
from fxmobile.script.quiet_script import quietly_script

SCRIPT, TRACE = "torch.jit.script", "torch.jit.trace"


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
    (a trace that does not replay ``gm`` raises ``ScriptingError``)."""
    # each rewrite runs (no short-circuit), and the code is generated again once, if needed
    if any([_drop_return_annotation(gm), _alias_aware_type_as(gm), _scriptable_empty_index(gm)]):
        gm.recompile()
    name = type(gm).__name__
    refuse_unused_draws(gm, name)
    try:
        scripted = quietly_script(gm)
    except Exception as exc:
        reason = str(exc).strip().splitlines()
        first = _with_hooks_named(gm, reason[0] if reason else type(exc).__name__)
        if example_inputs is None:
            raise ScriptingError(
                f"torch.jit.script could not compile the optimized {name}: "
                f"{exc}\nFix: pass example_inputs so fxmobile can trace it instead, or mark the "
                f"submodule named above as a leaf and make it scriptable."
            ) from exc
    else:
        refuse_rng_state_ops(_with_calls_inlined(scripted), name)  # a leaf's: not traced by fx
        return scripted, None
    partly = script_with_traced_hooked_leaves(gm, example_inputs)
    if partly is not None:
        scripted, names = partly
        return scripted, (
            f"scripting failed ({first}); the hooked module{'s' if len(names) > 1 else ''} "
            f"{', '.join(names)} traced with the example inputs (the hooks run at trace time), "
            f"the rest scripted"
        )
    traced, warned, before = trace(gm, example_inputs)
    differs = replays(traced, before, example_inputs)
    if differs is not None:
        raise ScriptingError(
            f"torch.jit.script could not compile the optimized {name} ({first}), and its "
            f"torch.jit.trace computes something else than the optimized graph on {differs} "
            f"{_why_a_trace_differs(differs, 'the hooks and submodules named above')}"
        )
    depends = "".join(f"torch.jit.trace warned: {w}; " for w in warned)
    note = (
        f"scripting failed ({first}); {depends}traced with the example inputs instead, so "
        f"control flow is fixed to the path those inputs took"
    )
    return traced, note


def _why_a_trace_differs(inputs: str, scriptable: str) -> str:
    """Why a trace computes something else on ``inputs``, and the fix (make ``scriptable``
    scriptable, or...)."""
    if inputs == EXAMPLE:
        return (
            f"(the tracer does not record every op: a write through .data is one). Fix: write "
            f"the value without .data, or make {scriptable} scriptable."
        )
    return (
        f"(forward branches on its inputs' memory layout, with is_contiguous() or a stride, and "
        f"the trace keeps the branch the example inputs took). Fix: make {scriptable} "
        f"scriptable (TorchScript keeps the branch), or compute the same for every layout."
    )


def refuse_unused_draws(gm: fx.GraphModule, name: str) -> None:
    """``RefusedError`` when ``gm`` draws random numbers it never uses (a random torch op
    whose result nothing reads): TorchScript would drop the draw, and every draw after it would
    take other numbers. Refused whatever ``check`` says."""
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method") and not node.users:
            call = ops.call_name(node)
            if call is not None and ops.call_op(node).random:
                raise unused_draw_error(name, f"torch.{call}")


def refuse_rng_state_ops(graph: torch._C.Graph, name: str) -> None:
    """``RefusedError`` when a forward's ``graph`` (calls inlined) seeds a generator
    (``aten::manual_seed``) or holds a generator object: refused on every route
    (``fxmobile.capture.random_calls``)."""
    for call in ops.rng_state_functions():
        for node in _find(graph, f"aten::{call}"):
            raise seed_call_error(name, f"torch.{call}", source_line(node))
    for node in _find(graph, "prim::Constant"):
        if node.output().type().kind() == "GeneratorType":
            user = next((u.user for u in node.output().uses()), node)
            call = "torch." + user.kind().split("::", 1)[-1]
            raise generator_error(name, call, source_line(user))


def _with_calls_inlined(module: torch.jit.ScriptModule) -> torch._C.Graph:
    """``module``'s forward graph, with the methods and functions it calls inlined when it calls
    any (the FX stage has written most module calls out already)."""
    graph = module.graph
    calls = _find(graph, "prim::CallMethod") or _find(graph, "prim::CallFunction")
    return module.inlined_graph if calls else graph


def _find(graph: torch._C.Graph, kind: str) -> list[torch._C.Node]:
    """The nodes of ``kind`` in ``graph``, blocks included (torch's C++ search: fast)."""
    found: list[torch._C.Node] = graph.findAllNodes(kind)  # type: ignore[attr-defined]
    return found


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


@dataclass
class Fallback:
    """A model torch.fx could not capture, as TorchScript, and how it was made."""

    module: torch.jit.ScriptModule
    route: str  # "torch.jit.trace" or "torch.jit.script"
    declined: list[str]  # routes tried before and why they were not taken
    notes: list[str]  # what the route fixed in place (torch's tracer warnings)


def fallback_to_torchscript(model: nn.Module, example_inputs: tuple[Any, ...] | None) -> Fallback:
    """``model`` (a fresh copy of it, in eval mode) as TorchScript without torch.fx.

    ``torch.jit.script`` is tried first. Where forward branches or loops on its inputs
    (``fxmobile.script.control_flow``), the scripted module is taken: a trace would keep one
    path. Otherwise, with example inputs, ``torch.jit.trace`` is taken when torch's tracer does
    not warn (each of its warnings says the recording may hold what the example's values
    decided: a branch on a tensor, ``.item()``, ``resize_``) and the trace replays forward on the
    example inputs and in other memory layouts (``fxmobile.script.jit_trace.replays``); else the
    scripted module is. Where scripting failed, a trace that replays is taken with its warnings
    in the notes, and one that does not is refused. Without example inputs only
    ``torch.jit.script`` can run.
    """
    name = type(model).__name__
    declined: list[str] = []
    scripted: torch.jit.ScriptModule | None = None
    failure: Exception | None = None
    try:
        scripted = quietly_script(deep_copy(model).eval())
    except Exception as exc:
        failure = exc
        declined.append(f"torch.jit.script failed: {first_line(exc)}")
    frozen = None if scripted is None else frozen_forward(scripted)
    if frozen is not None:
        refuse_rng_state_ops(frozen, name)
    if example_inputs is None:
        if failure is not None:
            raise ScriptingError(
                f"neither torch.fx nor torch.jit.script could capture {name} "
                f"({first_line(failure)}). Fix: pass example_inputs, so fxmobile can trace it "
                f"with torch.jit.trace and check the result."
            ) from failure
        assert scripted is not None
        return Fallback(scripted, SCRIPT, [], [])
    # Script first where forward branches on its inputs, trace first elsewhere: measured by
    # benchmarks/measure_fallback_order.py on six models both routes take, through the CPU
    # backend's TorchScript stage. With control flow on the inputs, the script keeps every
    # prepacked op and fused clamp of the path the trace records (1 and 1, 4 and 3: both
    # branches prepacked, 2 and 2), at the cost of the If or Loop and the paths not taken
    # (9 ops against 4, 11 against 6, 13 against 8); the one model whose script has fewer
    # prepacked ops (0 against 2) branches on is_contiguous(), which prepacking would flip,
    # and its trace computes another branch for channels-last inputs. Without such control
    # flow the two are as optimized (1 prepacked op each) and the trace is leaner: a cache
    # filled on the first call is 4 ops traced, 9 scripted (the dictionary lookup stays).
    if scripted is not None and frozen is not None and branches_on_inputs(frozen):
        return Fallback(scripted, SCRIPT, [], [])
    traced, warned, before = trace(deep_copy(model).eval(), example_inputs)
    differs = replays(traced, before, example_inputs)
    if not warned and differs is None:
        notes = ["torch.jit.trace fixed shapes and control flow to the example inputs'"]
        return Fallback(traced, TRACE, declined, notes)
    if scripted is not None:
        return Fallback(scripted, SCRIPT, [], [])
    if differs is not None:
        raise ScriptingError(
            f"neither torch.fx nor torch.jit.script could capture {name} "
            f"({'; '.join(declined)}), and its torch.jit.trace computes something else than "
            f"forward on {differs} {_why_a_trace_differs(differs, 'forward')}"
        )
    notes = [f"torch.jit.trace warned: {w}" for w in warned]
    notes.append(
        "torch.jit.trace fixed the branches the example inputs took: other inputs may take "
        "others, which the optimized module does not have"
    )
    return Fallback(traced, TRACE, declined, notes)
