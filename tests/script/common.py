"""What the TorchScript pass tests share: modules to rewrite, the context, and op counts.

The counts walk the graphs here, independently of ``fxmobile.script.graph_utils``, so a bug in
the counting the passes use for their own reports cannot hide itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import torch
from torch import nn

from fxmobile.script.freeze import freeze
from fxmobile.script.quiet_script import quietly_script
from fxmobile.script.stage import ScriptContext

CTX = ScriptContext(("forward",), ())


def scripted(model: nn.Module) -> torch.jit.ScriptModule:
    """``model`` in eval mode, scripted (not frozen: submodules and parameters still there)."""
    return quietly_script(model.eval())


def frozen(model: nn.Module, preserved: tuple[str, ...] = ()) -> torch.jit.ScriptModule:
    """Scripted and frozen, so with types of its own: in-place rewrites cannot leak into other
    modules of the same classes."""
    return freeze(scripted(model), list(preserved))


def _nodes(block: torch._C.Block) -> Iterator[torch._C.Node]:
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _nodes(inner)


def kinds(module: torch.jit.ScriptModule, method: str = "forward") -> Counter[str]:
    """Every node kind in ``method``'s graph, submodule calls inlined, nested blocks included."""
    graph = module._c._get_method(method).inlined_graph
    return Counter(node.kind() for node in _nodes(graph.block()))


def nodes_of(
    module: torch.jit.ScriptModule, kind: str, method: str = "forward"
) -> list[torch._C.Node]:
    """The nodes of ``kind`` in ``method``'s own graph (not inlined), in order."""
    graph = module._c._get_method(method).graph
    return [node for node in _nodes(graph.block()) if node.kind() == kind]


def constant_tensor(value: torch._C.Value) -> torch.Tensor:
    """The tensor a constant graph input holds. torch's stubs type ``toIValue`` as ``IValue``;
    it returns the Python value."""
    tensor = value.toIValue()
    assert isinstance(tensor, torch.Tensor), f"not a tensor constant: {tensor!r}"
    return tensor


def with_inputs(*inputs: torch.Tensor) -> ScriptContext:
    """The context of ``forward`` alone, with example inputs (for the passes that probe ranks
    or dtypes with them)."""
    return ScriptContext(("forward",), (), inputs)
