"""Whether a scripted forward branches on its inputs: the control flow a trace would fix.

``torch.jit.trace`` records the ops one call ran: a branch or a loop that depends on the
inputs' values, strides, shapes or dtypes is fixed to the example's path, and the tracer warns
only about some of them (not about ``if y.is_contiguous():``). ``branches_on_inputs`` reads the
scripted forward instead, frozen as the TorchScript stage freezes it (submodules inlined, their
attributes constants, so the branches an eval-mode module never takes, BatchNorm's training
checks, are gone): a ``prim::If`` condition, or a ``prim::Loop`` trip count or condition,
computed from forward's arguments is such control flow. A check that raises
(``if x.dim() != 4: raise ValueError(...)``) is not: every input it lets through takes the path
the example took.

A value is computed from the arguments when some input of the node that makes it is, or when a
node writes it in place (``ops.script_op``) from one that is. Two reads stop the chain, since
fxmobile's modules run on one device: ``prim::device`` and ``prim::is_cuda`` (a cache keyed by
``str(x.device)``, timm's LeViT, branches on the device, and every call takes the same path).
Control flow on module state alone (``if self.training``) is no branch on the inputs.
"""

from __future__ import annotations

import copy
import re

import torch

from fxmobile import ops
from fxmobile.script.freeze import freeze

# Reads of an argument that cannot differ between the calls of a module made for one device.
_SAME_FOR_EVERY_CALL = frozenset({"prim::device", "prim::is_cuda"})


def frozen_forward(module: torch.jit.ScriptModule) -> torch._C.Graph:
    """``module``'s forward as the TorchScript stage freezes it (submodules inlined, attributes
    constants), or inlined where freezing fails (more branches stay, never fewer)."""
    try:
        return freeze(copy.deepcopy(module).eval(), []).graph
    except Exception:
        return module.inlined_graph


def branches_on_inputs(graph: torch._C.Graph) -> list[str]:
    """``file:line`` (the node kind where TorchScript kept no source) of each branch or loop
    of a forward's ``graph`` (``frozen_forward``) that depends on forward's arguments, in graph
    order."""
    reached = {value.unique() for value in list(graph.inputs())[1:]}  # not ``self``
    found: list[str] = []
    _walk(graph.block(), reached, found)
    return list(dict.fromkeys(found))


def _walk(block: torch._C.Block, reached: set[int], found: list[str]) -> None:
    for node in block.nodes():
        kind = node.kind()
        inputs = list(node.inputs())
        if kind == "prim::If":
            if not any(_raises(inner) for inner in node.blocks()):
                _branch(node, inputs[0], reached, found)
            for inner in node.blocks():
                _walk(inner, reached, found)
            _outputs(
                node, reached, inputs[:1], [list(b.returnNode().inputs()) for b in node.blocks()]
            )
        elif kind == "prim::Loop":
            _loop(node, reached, found)
        elif kind not in _SAME_FOR_EVERY_CALL and any(v.unique() in reached for v in inputs):
            reached.update(v.unique() for v in node.outputs())
            if ops.script_op(node).writes:  # the written input holds a value from an argument
                reached.update(v.unique() for v in inputs)
        else:
            for inner in node.blocks():  # prim::With, prim::Closure
                _walk(inner, reached, found)


def _loop(node: torch._C.Node, reached: set[int], found: list[str]) -> None:
    """``prim::Loop(trip_count, condition, *carried)``; its block takes ``(i, *carried)`` and
    returns ``(condition, *carried)``: walked until what it reaches stops growing."""
    trip, start, *carried = list(node.inputs())
    body = next(iter(node.blocks()))
    params = list(body.inputs())
    for outer, param in zip(carried, params[1:], strict=True):
        if outer.unique() in reached:
            reached.add(param.unique())
    while True:
        before = len(reached)
        _walk(body, reached, [])
        returned = list(body.returnNode().inputs())
        for inner, param in zip(returned[1:], params[1:], strict=True):
            if inner.unique() in reached:
                reached.add(param.unique())
        if len(reached) == before:
            break
    for condition in (trip, start, returned[0]):
        _branch(node, condition, reached, found)
    _walk(body, reached, found)  # the branches inside the body, once
    _outputs(node, reached, [trip, start, returned[0]], [returned[1:]])


def _raises(block: torch._C.Block) -> bool:
    return any(node.kind() == "prim::RaiseException" for node in block.nodes())


def _branch(
    node: torch._C.Node, value: torch._C.Value, reached: set[int], found: list[str]
) -> None:
    if value.unique() in reached:
        found.append(source_line(node) or node.kind())


def _outputs(
    node: torch._C.Node,
    reached: set[int],
    deciding: list[torch._C.Value],
    returns: list[list[torch._C.Value]],
) -> None:
    """A control-flow node's outputs come from the arguments when what decides the path does,
    or when a path returns such a value."""
    decided = any(v.unique() in reached for v in deciding)
    for i, output in enumerate(node.outputs()):
        if decided or any(len(r) > i and r[i].unique() in reached for r in returns):
            reached.add(output.unique())


def source_line(node: torch._C.Node) -> str | None:
    """``file:line`` of the code TorchScript compiled ``node`` from, when it kept it."""
    found = re.search(r'File "([^"]+)", line (\d+)', str(node.sourceRange()))
    return f"{found[1]}:{found[2]}" if found else None
