"""Which tensors of a TorchScript graph are written in place, traced back through views.

torch's subgraph rewrites (``_jit_pass_fuse_add_relu``, the conv1d -> conv2d transform) place
their replacement without looking at aliasing: a fused node can land before an in-place op that
wrote one of its inputs through a view (``x.unsqueeze(-1).add_(c); relu(x + x)`` became
``_add_relu(x, x)`` first, reading ``x`` unwritten: found by the fuzzer). The passes that call
them check first whether a pattern's inputs share a root with a written tensor. The passes that
move layouts and buffers (``make_inputs_channels_last``, ``keep_channels_last_shuffle``,
``use_inplace_ops``) ask the same questions. What is a view and what writes comes from each
node's own schema (``fxmobile.ops.script_op``: any registered op's, so a prepacked run's result
is fresh, not a view of its input); an op without one may alias and write.
"""

from __future__ import annotations

import torch

from fxmobile import ops
from fxmobile.script.graph_utils import iter_nodes


def root(value: torch._C.Value) -> torch._C.Value:
    """The value ``value`` is a view of, following view ops back to their source."""
    while True:
        node = value.node()
        if not list(node.inputs()) or not ops.script_op(node).view:
            return value
        value = node.inputsAt(0)


def writers(graph: torch._C.Graph) -> list[torch._C.Node]:
    """The nodes that write one of their tensor inputs (a schema with ``Tensor(a!)``, or no
    schema at all)."""
    return [
        node for node in iter_nodes(graph) if list(node.inputs()) and ops.script_op(node).writes
    ]


def written_roots(graph: torch._C.Graph) -> set[torch._C.Value]:
    """Roots of every tensor an in-place op writes."""
    return {root(node.inputsAt(0)) for node in writers(graph)}


STRIDES_READ = (
    "method reads strides or storage (as_strided...): a packed op's output strides differ"
)
WRITE_THROUGH_RESHAPE = (
    "method writes through a reshape, flatten, view or contiguous (a view of one layout, a copy "
    "of another): a packed op's output strides differ"
)


def why_layout_matters(graph: torch._C.Graph) -> str | None:
    """Why ``graph`` could compute something else if its convolutions returned tensors of other
    strides than eager's, or None. A prepacked run returns its result in the layout it computes
    in: a 1-channel conv of an NCHW input comes back with channels-last strides (so does
    upstream's), and a ``cat`` of it is channels-last. Values stay the same; what reads memory
    order does not: ``as_strided`` and the other stride readers, and a write through a view
    that is a copy when the strides differ, of a tensor something else reads. Only tensors a
    convolution's strides can reach count (any op on one passes them on); the caller's inputs
    keep the caller's strides."""
    reached: set[torch._C.Value] = set()
    for node in iter_nodes(graph):
        if node.kind() in _CONVOLUTIONS or any(v in reached for v in node.inputs()):
            reached.update(node.outputs())
    for node in iter_nodes(graph):
        reads = node.kind().split("::", 1)[-1] in ops.STRIDE_READERS
        if reads and any(v in reached for v in node.inputs()):
            return STRIDES_READ
    for writer in writers(graph):
        value = writer.inputsAt(0)
        while True:
            node = value.node()
            if not list(node.inputs()):
                break
            reshapes = node.kind().split("::", 1)[-1] in ops.LAYOUT_DEPENDENT_VIEWS
            base = node.inputsAt(0)
            if reshapes and base in reached and not _read_only_through(base, node):
                return WRITE_THROUGH_RESHAPE
            if not ops.script_op(node).view:
                break
            value = node.inputsAt(0)
    return None


_CONVOLUTIONS = frozenset({"aten::conv2d", "aten::conv_transpose2d"})


def _read_only_through(value: torch._C.Value, user: torch._C.Node) -> bool:
    """Nothing but ``user`` reads ``value``, nor any tensor ``value`` is a view of: a write
    through ``user``'s result is then seen only through that result, a view or a copy alike."""
    while len(value.uses()) == 1 and value.uses()[0].user == user:
        node = value.node()
        if not list(node.inputs()) or not ops.script_op(node).view:
            return True
        value, user = node.inputsAt(0), node
    return False
