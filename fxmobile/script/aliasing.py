"""Which tensors of a TorchScript graph are written in place, traced back through views.

torch's subgraph rewrites (``_jit_pass_fuse_add_relu``, the conv1d -> conv2d transform) place
their replacement without looking at aliasing: a fused node can land before an in-place op that
wrote one of its inputs through a view (``x.unsqueeze(-1).add_(c); relu(x + x)`` became
``_add_relu(x, x)`` first, reading ``x`` unwritten: found by the fuzzer). The passes that call
them check first whether a pattern's inputs share a root with a written tensor.
"""

from __future__ import annotations

import torch

from fxmobile.script.graph_utils import iter_nodes

# Ops whose output may share memory with their first input.
VIEW_KINDS = frozenset(
    {
        "aten::view",
        "aten::reshape",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::flatten",
        "aten::unflatten",
        "aten::select",
        "aten::slice",
        "aten::narrow",
        "aten::transpose",
        "aten::permute",
        "aten::t",
        "aten::expand",
        "aten::expand_as",
        "aten::view_as",
        "aten::reshape_as",
        "aten::as_strided",
        "aten::detach",
        "aten::contiguous",
        "aten::chunk",
        "aten::split",
        "aten::unbind",
        "aten::alias",
        "prim::ListUnpack",
        "aten::__getitem__",
    }
)


def root(value: torch._C.Value) -> torch._C.Value:
    """The value ``value`` is a view of, following view ops back to their source."""
    while True:
        node = value.node()
        if node.kind() not in VIEW_KINDS or not list(node.inputs()):
            return value
        value = node.inputsAt(0)


def writers(graph: torch._C.Graph) -> list[torch._C.Node]:
    """The aten nodes that write one of their tensor inputs (a schema with ``Tensor(a!)``)."""
    found = []
    for node in iter_nodes(graph):
        if not node.kind().startswith("aten::") or not list(node.inputs()):
            continue
        try:
            schema = node.schema()
        except RuntimeError:
            continue
        if "!)" in schema:
            found.append(node)
    return found


def written_roots(graph: torch._C.Graph) -> set[torch._C.Value]:
    """Roots of every tensor an in-place op writes."""
    return {root(node.inputsAt(0)) for node in writers(graph)}
