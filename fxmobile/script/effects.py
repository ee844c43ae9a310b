"""What a node of a frozen, prepacked graph does to memory, for the passes that move layouts
and buffers (``make_inputs_channels_last``, ``use_inplace_ops``).

``fxmobile.ops.script_op`` reads aten and prim schemas and calls every other op ``UNKNOWN``
(may alias, may write). The prepacked run ops (``prepacked::conv2d_clamp_run``...) then look
like views of their input, so every in-place activation after a convolution looks like a write
to the network's input. Their registered schemas say otherwise (``run(Tensor X, ...) ->
Tensor Y``: no alias set, nothing written), and torch holds every op to its schema; this module
reads the schema of any registered op, then follows views back to their source as
``fxmobile.script.aliasing`` does.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch

from fxmobile import ops
from fxmobile.script import aliasing
from fxmobile.script.graph_utils import iter_nodes


@functools.cache
def _schema_effects(schema: str) -> ops.OpInfo | None:
    try:
        parsed = torch._C.parse_schema(schema)
    except RuntimeError:
        return None
    written = any(a.alias_info is not None and a.alias_info.is_write for a in parsed.arguments)
    view = not written and any(r.alias_info is not None for r in parsed.returns)
    return ops.OpInfo(parsed.name, view, written, random=False)


def effects(node: torch._C.Node) -> ops.OpInfo:
    """``ops.script_op``, or for another namespace the node's own registered schema."""
    info = ops.script_op(node)
    kind = node.kind()
    if info is not ops.UNKNOWN or kind.startswith(("aten::", "prim::")):
        return info
    try:
        schema = node.schema()
    except RuntimeError:
        return info
    if schema == "(no schema)":
        return info
    return _schema_effects(schema) or info


def root(value: torch._C.Value) -> torch._C.Value:
    """The value ``value`` is a view of, following views (as ``effects`` tells them) back."""
    return aliasing.root(value, effects)


def written_roots(graph: torch._C.Graph) -> set[torch._C.Value]:
    """Roots of every tensor a node writes in place (any input a writing schema marks)."""
    roots = set()
    for node in iter_nodes(graph):
        info = effects(node)
        if info.writes and list(node.inputs()):
            roots.add(root(node.inputsAt(0)))
    return roots


def in_order(block: torch._C.Block) -> Iterator[torch._C.Node]:
    """The nodes of ``block`` and of the blocks inside it, each before the nodes after it."""
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from in_order(inner)
