"""What the export stage's passes share: reading a node's tensor, inserting ATen calls, constants.

The graph these passes rewrite is functional ATen (``export.functional``): no op writes in
place, so a rewrite never has to ask who else sees a tensor, and each operator has one spelling
(``aten.layer_norm.default``), which the passes match by identity. Shapes and dtypes come from
the node's ``tensor_meta`` (shape propagation on the example inputs, refreshed by the stage
before a pass that needs them) or, for a node export made, its ``val``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from fxmobile.passes.graph_utils import add_constant

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


def integer(value: Any) -> int:
    """An int argument of an op (a dim, an index, a size): FX types arguments as any node
    argument, which ``int()`` alone does not accept."""
    return int(value)


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


def scalar(gm: fx.GraphModule, base: str, value: float, like: torch.dtype) -> fx.Node:
    """A one-element constant of dtype ``like``: what a Python number in a binary op becomes,
    without the dtype conversion a bare number costs in the program (an int or a float64
    scalar is converted at run time, on a portable kernel)."""
    return constant(gm, base, torch.tensor([value], dtype=like))
