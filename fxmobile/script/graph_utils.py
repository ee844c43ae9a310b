"""Reading TorchScript modules: methods, nodes (blocks included), op histograms, tensor bytes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from fxmobile.script.jit_passes import jit

ScriptModule = torch.jit.ScriptModule

# Node kinds that are bookkeeping, not work a runtime dispatches to a kernel.
_BOOKKEEPING = frozenset(
    {
        "prim::Constant",
        "prim::GetAttr",
        "prim::ListConstruct",
        "prim::ListUnpack",
        "prim::TupleConstruct",
        "prim::TupleUnpack",
        "prim::DictConstruct",
        "prim::Return",
        "prim::Param",
    }
)


# What ``constant`` gives for a value that no ``prim::Constant`` makes.
NOT_CONSTANT: Any = object()


def constant(value: torch._C.Value) -> Any:
    """The Python value a ``prim::Constant`` gives ``value`` (None included), else
    ``NOT_CONSTANT``. Where a None constant and a computed value may be treated alike,
    ``value.toIValue()`` alone says the same: None for both."""
    return value.toIValue() if value.node().kind() == "prim::Constant" else NOT_CONSTANT


# The node kinds that own blocks. Asking a node for its blocks costs 20x reading its kind,
# and a graph before freezing has thousands of nodes, none of which own any.
_WITH_BLOCKS = frozenset({"prim::If", "prim::Loop", "prim::With", "prim::Closure"})


def iter_nodes(graph: torch._C.Graph) -> Iterator[torch._C.Node]:
    """Every node of ``graph``, descending into the blocks of ``prim::If``, ``prim::Loop``..."""
    stack = [graph.block()]
    while stack:
        block = stack.pop()
        for node in block.nodes():
            yield node
            if node.kind() in _WITH_BLOCKS:
                stack.extend(node.blocks())


def method_graphs(module: ScriptModule, methods: Sequence[str]) -> Iterator[torch._C.Graph]:
    """The graphs of ``module``'s ``methods``, not inlined: rewriting one rewrites the method."""
    for name in methods:
        yield module._c._get_method(name).graph


def existing_methods(module: ScriptModule, names: Sequence[str]) -> list[str]:
    """Those of ``names`` that ``module`` has as methods, in order."""
    return [name for name in names if module._c._has_method(name)]


def op_histogram(module: ScriptModule, methods: Sequence[str]) -> Counter[str]:
    """Counts of operator kinds across ``methods`` (inlined: submodule calls are expanded)."""
    counts: Counter[str] = Counter()
    for name in methods:
        graph = module._c._get_method(name).inlined_graph
        for node in iter_nodes(graph):
            if node.kind() not in _BOOKKEEPING:
                counts[node.kind()] += 1
    return counts


def unfused_ops(module: ScriptModule, methods: Sequence[str]) -> Counter[str]:
    """Ops a mobile runtime dispatches one by one: nodes that produce a tensor without a packed
    context. A prepacked run op (XNNPACK, Vulkan, Metal) or a quantized op reads its weights
    from a context object and carries its bias and clamp with it; everything else that makes a
    tensor (an add, a pool, a lone relu, a view) is one more kernel call and pass over memory.
    """
    counts: Counter[str] = Counter()
    for name in methods:
        for node in iter_nodes(module._c._get_method(name).inlined_graph):
            if node.kind().startswith("prim::"):  # control flow and bookkeeping; the ops
                continue  # inside an If or Loop block are counted themselves
            makes_tensor = any(isinstance(v.type(), torch._C.TensorType) for v in node.outputs())
            packed = any(isinstance(v.type(), torch._C.ClassType) for v in node.inputs())
            if makes_tensor and not packed:
                counts[node.kind()] += 1
    return counts


def count_kinds(module: ScriptModule, methods: Sequence[str], kinds: set[str]) -> int:
    """Nodes of the given kinds in ``methods``, submodule calls inlined."""
    return sum(
        1
        for name in methods
        for n in iter_nodes(module._c._get_method(name).inlined_graph)
        if n.kind() in kinds
    )


def node_count(module: ScriptModule, methods: Sequence[str]) -> int:
    """How many nodes ``methods`` hold, blocks included, bookkeeping (constants, lists) aside."""
    return sum(
        1
        for g in method_graphs(module, methods)
        for n in iter_nodes(g)
        if n.kind() not in _BOOKKEEPING
    )


def _tensors_in(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensors_in(v)
    elif isinstance(value, torch.ScriptObject) and _is_custom_class(value):
        yield from _tensors_in(value.__getstate__())


def _is_custom_class(value: torch.ScriptObject) -> bool:
    """A C++ custom class object (a packed context), as opposed to a submodule."""
    qualified: str = value._type().qualified_name()
    return qualified.startswith("__torch__.torch.classes.") and bool(
        value._has_method("__getstate__")  # type: ignore[attr-defined]
    )


def tensor_bytes(module: ScriptModule, methods: Sequence[str]) -> int:
    """Bytes of tensors held by the module: attributes, packed contexts and graph constants.

    Each storage is counted once, so a weight both in an attribute and a constant counts once.
    """
    seen: set[int] = set()
    total = 0

    def add(t: torch.Tensor) -> None:
        nonlocal total
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            return
        seen.add(storage.data_ptr())
        total += storage.nbytes()

    for _, value in jit._jit_debug_module_iterators(module._c)["named_attributes_r"]:
        for t in _tensors_in(value):
            add(t)
    for g in method_graphs(module, methods):
        for node in iter_nodes(g):
            if node.kind() == "prim::Constant" and node.hasAttribute("value"):
                if node.kindOf("value") == "t":
                    add(node.t("value"))
                elif node.kindOf("value") == "ival":
                    for t in _tensors_in(node.ival("value")):
                        add(t)
    return total
