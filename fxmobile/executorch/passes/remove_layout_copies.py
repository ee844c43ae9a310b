"""Copies that only change the memory format, removed; a dtype change they make is kept.

    y = clone(x, memory_format=M)                      ->  y = x
    y = _to_copy(x, memory_format=M)                   ->  y = x      (same dtype and device)
    y = _to_copy(x, dtype=T, memory_format=M)          ->  y = _to_copy(x, dtype=T)

    M: torch.channels_last, torch.contiguous_format... (``x.contiguous(memory_format=M)``,
    ``x.to(memory_format=M)``, ``x.contiguous()`` of a permuted x)

A memory format is how a tensor's elements lie in memory, not what they are: every ATen op
computes the same values from either layout, and in the functional graph the export stage
rewrites no op writes through a view or reads a stride (``export.rewritable``), so a copy that
only changes it has no effect on any value. ExecuTorch turns such a copy into
``_clone_dim_order`` or ``_to_dim_order_copy`` with another dim order, which XNNPACK declines
("Only dim-order preserving clones are supported"): a model that makes its activations
channels-last inside ``forward`` runs that copy on a portable kernel between two delegate calls.
The delegate picks its own layout.

Left alone, with the reason: a copy the graph returns, and every copy when the graph returns a
tensor in a memory format other than the contiguous one (ExecuTorch's program returns its outputs
in the layout the graph gives them, channels-last included, and an app may read the buffer
itself: the layout of an output is part of what the program hands over, and a layout copy
upstream may be what sets it; the gate, which compares values, would not see the difference),
a dtype change whose input dtype is unknown, and a copy of a transposed attention
(``scaled_dot_product_attention`` that ``decompose_sdpa`` left) that a reshape reads: the
lowering decomposes the attention into another layout and would make the reshape a view of
strides it cannot take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import aten, call, contiguous, dtype, replace_with, shape
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.stage import FxContext, FxPass

COPIES = frozenset({aten.clone.default, aten._to_copy.default})
# What a memory_format argument may say and still ask for no layout of its own.
NO_LAYOUT = (None, torch.preserve_format)


@dataclass(frozen=True)
class LayoutCopy:
    """A copy that sets a memory format, and what of it to keep."""

    node: fx.Node
    source: fx.Node
    conversion: dict[str, Any] | None  # a dtype change to keep (_to_copy's arguments), or None


def can_remove(node: fx.Node) -> LayoutCopy | str | None:
    """The copy ``node`` makes, a reason to stay, or None when it is no copy that sets a memory
    format."""
    if node.op != "call_function" or node.target not in COPIES:
        return None
    if node.kwargs.get("memory_format") in NO_LAYOUT:
        return None
    source = node.args[0]
    assert isinstance(source, fx.Node)
    if any(user.op == "output" for user in node.users):
        return "the graph returns it: the program's output keeps the layout eager gives it"
    if _attention_layout(source) and any(_reshapes(user) for user in node.users):
        return (
            "a reshape reads a view of an attention it copies: ExecuTorch's lowering decomposes "
            "the attention into another layout, and the reshape left without the copy a view "
            "of strides it cannot take"
        )
    if node.target is aten.clone.default:
        return LayoutCopy(node, source, None)
    kwargs = {k: v for k, v in node.kwargs.items() if k != "memory_format"}
    if "dtype" in kwargs:
        found = dtype(source)
        if found is None:
            return "input dtype unknown (pass example_inputs)"
        if kwargs["dtype"] == found:
            del kwargs["dtype"]
    if set(kwargs) <= {"layout", "device", "non_blocking", "pin_memory"} and _same_place(kwargs):
        return LayoutCopy(node, source, None)
    return LayoutCopy(node, source, kwargs)


def _attention_layout(source: fx.Node) -> bool:
    """Whether ``source`` is a non-contiguous view (through transposes and permutes) of a
    ``scaled_dot_product_attention`` left in the graph: its strides at export are not those
    the lowering's decomposition of the attention gives (timm's mobilenetv4_hybrid_large)."""
    node = source
    while node.op == "call_function" and node.target in _LAYOUT_VIEWS:
        below = node.args[0]
        assert isinstance(below, fx.Node)
        node = below
    return (
        node is not source
        and node.target is aten.scaled_dot_product_attention.default
        and (contiguous(source) is False)
    )


_LAYOUT_VIEWS = frozenset({aten.transpose.int, aten.permute.default})


def _reshapes(user: fx.Node) -> bool:
    """Whether ``user`` is a reshape to another shape than its input's."""
    if user.op != "call_function" or user.target is not aten.reshape.default:
        return False
    return shape(user) != shape(user.args[0])


def _same_place(kwargs: dict[str, Any]) -> bool:
    """Whether the copy's other arguments keep the tensor where and what it is (strided, on
    the CPU the exported program runs on)."""
    return (
        kwargs.get("layout", torch.strided) == torch.strided
        and torch.device(kwargs.get("device") or "cpu").type == "cpu"
        and not kwargs.get("pin_memory")
    )


def remove(gm: fx.GraphModule, match: LayoutCopy) -> fx.Node:
    """What replaces ``match.node``: its input, or a copy of it without the memory format."""
    if match.conversion is None:
        return match.source
    with gm.graph.inserting_before(match.node):
        return call(gm.graph, aten._to_copy.default, match.source, **match.conversion)


def returned_layout(gm: fx.GraphModule) -> str | None:
    """Why no layout copy of ``gm`` may go: a tensor it returns is in another memory format than
    the contiguous one (or its layout is unknown); None when every output is contiguous."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    for node in output.all_input_nodes:
        meta = node.meta.get("tensor_meta")
        if meta is not None and hasattr(meta, "memory_format"):
            contiguous = meta.memory_format is torch.contiguous_format
            layout = str(meta.memory_format) if meta.memory_format else "strided"
        elif hasattr(node.meta.get("val"), "is_contiguous"):
            contiguous = bool(node.meta["val"].is_contiguous())
            layout = "strided"
        else:
            return "output layout unknown (pass example_inputs)"
        if not contiguous:
            return f"the graph returns a {layout} tensor: the program returns it in that layout"
    return None


class RemoveLayoutCopies(FxPass):
    """Drop the memory format of every copy inside the graph; drop the copy when that was all
    it did."""

    optimization = MobileOptimizerType.REMOVE_LAYOUT_COPIES
    summary: ClassVar[str] = "x.contiguous(memory_format=M), x.to(memory_format=M) -> x"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        returned = returned_layout(gm)
        for node in list(gm.graph.nodes):
            match = can_remove(node)
            if match is not None and returned is not None:
                match = returned  # a copy upstream may be what sets it
            if isinstance(match, str):
                skips.add(match)
            elif match is not None:
                replace_with(node, remove(gm, match))
                rewrites += 1
        return PassResult(gm, rewrites, dict(skips))
