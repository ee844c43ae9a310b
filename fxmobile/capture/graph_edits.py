"""What capture does to the traced graph before handing it on, and the arguments it specializes.

- **Arguments left at None.** A parameter whose default is None (``bias: Optional[Tensor] =
  None``) that the example inputs do not reach is specialized to None before tracing, as a
  concrete argument: torch.fx's placeholder is never None, so a trace of ``if bias is not
  None: y = y + bias`` would record the addition, and the graph fail on the call without
  ``bias`` that eager takes. The report says which were specialized.
- **Concrete arguments baked in**: their placeholders and torch.fx's guards on them go.
- **Shape guards**: a graph specialized to the example inputs' shapes asserts them.
- **String annotations** (``from __future__ import annotations``) resolved, for TorchScript.
- **Hooked leaves** whose hooks were traced call a copy without them.
"""

from __future__ import annotations

import inspect
import operator
import typing
from typing import Any

import torch
from torch import fx, nn

from fxmobile.capture.hooks import without_hooks
from fxmobile.errors import InvalidValueError
from fxmobile.options import Options


def left_at_none(model: nn.Module, options: Options) -> dict[str, None]:
    """The parameters of ``model.forward`` whose default is None and that neither the example
    inputs nor ``concrete_args`` give a value: they bind to None, each as a concrete argument.

    The example inputs bind to the parameters that ``concrete_args`` leaves, in order; without
    example inputs, none is given, so every None default is specialized (``concrete_args=
    {name: torch.fx.PH}`` keeps one an input)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    concrete = options.concrete_args or {}
    given = len(options.example_inputs or ())
    found: dict[str, None] = {}
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            if param.kind is param.VAR_POSITIONAL:
                given = 0  # *args takes what is left
            continue
        if param.name in concrete:
            continue
        if given:
            given -= 1
            continue
        if param.default is None:
            found[param.name] = None
    return found


def none_note(names: dict[str, None], options: Options) -> str:
    """The report's line for the arguments ``left_at_none`` specialized."""
    shown = ", ".join(names)
    fix = (
        "pass them in example_inputs"
        if options.example_inputs is not None
        else "pass concrete_args={name: torch.fx.PH}"
    )
    return (
        f"{shown} left at {'its' if len(names) == 1 else 'their'} default None: specialized "
        f"away, so the optimized module does not take {'it' if len(names) == 1 else 'them'} "
        f"({fix} to keep {'it an input' if len(names) == 1 else 'them inputs'})"
    )


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


def call_unhooked_copies(gm: fx.GraphModule, traced: dict[int, nn.Module]) -> None:
    """Leaf calls of modules whose hooks were traced call a copy without them."""
    for node in gm.graph.nodes:
        if node.op == "call_module" and id(gm.get_submodule(node.target)) in traced:
            gm.add_submodule(str(node.target), without_hooks(gm.get_submodule(node.target)))


def refuse_none_output(model: nn.Module, graph: fx.Graph) -> None:
    """Refuse a forward that returns None: every pass would remove its work as unused."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    if output.args and output.args[0] is None:
        name = type(model).__name__
        raise InvalidValueError(
            f"{name}.forward returns None, so the optimized model would compute nothing "
            f"(fxmobile removes work whose result is unused). Fix: return the output tensor(s) "
            f"from {name}.forward (is a `return` missing?)."
        )


# torch.fx's guards on a specialized argument: ``x == value`` then ``torch._assert``, or, for
# None, one call of this.
_ASSERT_IS_NONE = fx._symbolic_trace._assert_is_none


def bake_concrete_args(gm: fx.GraphModule, root: nn.Module, concrete_args: dict[str, Any]) -> None:
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
            elif user.target is _ASSERT_IS_NONE:
                gm.graph.erase_node(user)
        for user in list(node.users):  # any other use sees the baked-in value
            user.args = _substitute(user.args, node, value)
            user.kwargs = _substitute(user.kwargs, node, value)
        gm.graph.erase_node(node)
    gm.recompile()


def resolve_string_annotations(gm: fx.GraphModule, root: nn.Module) -> None:
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
