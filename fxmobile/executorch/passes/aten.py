"""What the export stage's passes share: reading a node's tensor, inserting ATen calls, constants.

The graph these passes rewrite is functional ATen (``export.functional``): no op writes in
place, so a rewrite never has to ask who else sees a tensor, and each operator has one spelling
(``aten.layer_norm.default``), which the passes match by identity. Shapes and dtypes come from
the node's ``tensor_meta`` (shape propagation on the example inputs, refreshed by the stage
before a pass that needs them) or, for a node export made, its ``val``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import fx

from fxmobile import ops
from fxmobile.infra import PassResult, Skips
from fxmobile.passes.graph_utils import add_constant

Match = TypeVar("Match")

aten = torch.ops.aten


def tensor(node: Any) -> Any:
    """The shape-and-dtype record of ``node`` (``tensor_meta`` or export's fake ``val``), or
    None when ``node`` is not a node of a known tensor."""
    if not isinstance(node, fx.Node):
        return None
    found = node.meta.get("tensor_meta")
    if found is None:
        found = node.meta.get("val")
    return found if hasattr(found, "shape") and hasattr(found, "dtype") else None


def shape(node: Any) -> tuple[int, ...] | None:
    """The static shape of ``node``'s tensor, or None when unknown or symbolic."""
    found = tensor(node)
    if found is None:
        return None
    try:
        return tuple(int(d) for d in found.shape)
    except TypeError:  # a symbolic size
        return None


def dtype(node: Any) -> torch.dtype | None:
    """The dtype of ``node``'s tensor, or None when unknown."""
    found = tensor(node)
    return None if found is None else found.dtype


def float32_shape(source: fx.Node) -> tuple[int, ...] | str:
    """The static shape of ``source``, a float32 tensor the XNNPACK delegate can take, or why a
    pass leaves its op alone: a shape unknown or symbolic, another dtype."""
    sizes = shape(source)
    if sizes is None:
        return "input shape unknown (pass example_inputs)"
    if dtype(source) is not torch.float32:
        return f"{dtype(source)} input: the XNNPACK delegate computes float32"
    return sizes


def integer(value: Any) -> int:
    """An int argument of an op (a dim, an index, a size): FX types arguments as any node
    argument, which ``int()`` alone does not accept."""
    return int(value)


def integers(values: Any) -> list[int]:
    """An int-list argument of an op (sizes, a kernel, repeats) as ints."""
    return [integer(v) for v in values]


def numel(sizes: Sequence[int]) -> int:
    """Elements of a tensor of ``sizes``."""
    return math.prod(sizes)


def call(graph: fx.Graph, op: Any, *args: Any, **kwargs: Any) -> fx.Node:
    """A ``call_function`` node of ``op`` at the graph's insertion point."""
    return graph.call_function(op, args, kwargs or None)


def constant(gm: fx.GraphModule, base: str, value: torch.Tensor) -> fx.Node:
    """``value`` as a buffer of ``gm``, read by a new ``get_attr`` node at the insertion point
    (export lifts it into a constant of the program, which XNNPACK packs with its op)."""
    return gm.graph.get_attr(add_constant(gm, base, value))


def scalar(gm: fx.GraphModule, base: str, value: float, like: Any) -> fx.Node:
    """``value`` as a constant of ``like``'s dtype with as many dims as ``like``, all of size
    1: what a Python number in arithmetic with ``like`` becomes, without the dtype conversion a
    bare number costs in the program (an int or a float64 scalar is converted at run time, on a
    portable kernel). It broadcasts to ``like``'s shape and no further: a 0-d ``like`` stays 0-d.
    """
    found = tensor(like)
    assert found is not None, f"{like} has no recorded tensor"
    return constant(gm, base, torch.full([1] * len(found.shape), value, dtype=found.dtype))


def argument(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """``node``'s argument ``name``, given by position ``index`` or by keyword, else
    ``default``."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def input_independent(node: Any) -> bool:
    """Whether ``node``'s value is the same whatever the model's inputs are: no placeholder
    among the nodes it is computed from (a parameter, a buffer, a constant, or ops on them)."""
    if not isinstance(node, fx.Node):
        return True
    seen: set[fx.Node] = set()
    todo = [node]
    while todo:
        current = todo.pop()
        if current.op == "placeholder":
            return False
        for source in current.all_input_nodes:
            if source not in seen:
                seen.add(source)
                todo.append(source)
    return True


def reduced_dims(dims: Any, rank: int) -> tuple[int, ...] | None:
    """The dims a reduction's ``dim`` argument names, non-negative and sorted; every dim for an
    empty or missing list (ATen's meaning), None when one is out of range."""
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return tuple(range(rank))
    named = [int(d) for d in (dims if isinstance(dims, list | tuple) else [dims])]
    if any(not -rank <= d < rank for d in named) or rank == 0:
        return None
    return tuple(sorted({d + rank if d < 0 else d for d in named}))


def operator_facts(target: Any) -> ops.OpInfo | None:
    """What the ATen operator ``target`` does (``fxmobile.ops``' facts, read from the schemas
    and tags of its overload packet: whether it draws random numbers, leaves memory
    uninitialized, may return a view), or None when ``target`` is no ATen operator. Whether it
    writes comes from the overload's own schema: ``_native_batch_norm_legit.no_stats`` (the
    weight standardization of timm's NF-Nets, on parameters only) writes nothing, where the
    packet's default overload writes its running statistics."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    arguments = target._schema.arguments
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in arguments)
    return dataclasses.replace(ops.aten(target.overloadpacket.__name__), writes=writes)


def positive_dim(dim: Any, rank: int) -> int:
    """``dim`` counted from the front (``-1`` of a rank-4 tensor is 3)."""
    index = int(dim)
    return index + rank if index < 0 else index


def slice_of(graph: fx.Graph, source: Any, dim: int, start: int, end: int) -> fx.Node:
    """``source[start:end]`` along ``dim``, step 1 (the slice XNNPACK takes), at the graph's
    insertion point."""
    return call(graph, aten.slice.Tensor, source, dim, start, end, 1)


def rewrite_each(
    gm: fx.GraphModule,
    check: Callable[[fx.Node], Match | str | None],
    rewrite: Callable[[fx.GraphModule, Match], fx.Node],
) -> PassResult[fx.GraphModule]:
    """The loop of a pass that rewrites nodes one by one: each node in graph order goes to
    ``check`` (a match, the reason it is left alone, or None for a node it does not look at),
    and each match to ``rewrite``, whose node then takes the matched node's users, and its
    record where its own is silent (``replace_with``)."""
    rewrites, skips = 0, Skips()
    for node in list(gm.graph.nodes):
        match = check(node)
        if isinstance(match, str):
            skips.add(match)
        elif match is not None:
            replace_with(node, rewrite(gm, match))
            rewrites += 1
    return PassResult(gm, rewrites, dict(skips))


def replace_with(node: fx.Node, value: fx.Node) -> None:
    """Route ``node``'s users to ``value``, which computes the same tensor, and erase ``node``.
    ``value`` takes what ``node``'s record says that its own does not (shape, dtype, source
    line): a later node the same pass rewrites still knows its input's shape."""
    for key, found in node.meta.items():
        value.meta.setdefault(key, found)
    node.replace_all_uses_with(value)
    node.graph.erase_node(node)


def contiguous(node: Any) -> bool | None:
    """Whether ``node``'s tensor is laid out row-major (strides of size-1 dims aside), as
    recorded when the example inputs ran; None when unknown. Export's decompositions follow
    the strides: a permuted tensor is not contiguous, and some decompose differently for it."""
    found = tensor(node)
    strides = getattr(found, "stride", None)
    if found is None or strides is None:
        return None
    strides = strides() if callable(strides) else strides
    try:
        sizes, steps = [int(d) for d in found.shape], [int(s) for s in strides]
    except TypeError:  # symbolic
        return None
    expected = 1
    for size, step in zip(reversed(sizes), reversed(steps), strict=True):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True
