"""Move tensor inputs to the Vulkan device and tensor outputs back (upstream's automatic transfer).

    graph(%x : Tensor):  ... f(%x) ...   ->   %xv = aten::to(%x, "vulkan", None, False, False)
                                              ... f(%xv) ...
    return (%y)                          ->   return (aten::to(%y, "cpu", None, False, False))

(``aten::to.prim_Device``; the device is a ``Device`` constant, as in upstream's graph after its
canonical optimizations.) The module is then marked ``requires_backend_transfers = False``, which
tells the runtime it need not move tensors itself. Blocklisting
``MobileOptimizerType.VULKAN_AUTOMATIC_GPU_TRANSFER`` switches all of this off.

Where this differs from upstream, on purpose:

- Upstream moves the tensors of the first method only; fxmobile those of every rewritten method
  (forward and the preserved ones), since the mark speaks for the whole module.
- Upstream inserts an input's transfer before the node preceding its first use in use-list order,
  which may lie in a nested block (where torch 2.15 fails with an internal assert, "insert ...
  before the Param node"); fxmobile inserts it before the first top-level node that uses the
  input, so every use, nested ones included, reads the moved tensor.
- Upstream moves only outputs typed ``Tensor``; fxmobile also moves the tensor elements of a tuple
  built for the return (``return y, h``). Other inputs and outputs that hold tensors (optional,
  list or nested types) stay where they are and are reported.
"""

from __future__ import annotations

from typing import Any

import torch

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.script.stage import ScriptContext, ScriptPass

MARK = "requires_backend_transfers"
GPU = torch.device("vulkan")
CPU = torch.device("cpu")

Node = torch._C.Node
Value = torch._C.Value


def _is_tensor(value: Value) -> bool:
    return isinstance(value.type(), torch._C.TensorType)


def _holds_tensor(value: Value) -> bool:
    return "Tensor" in str(value.type())


def insert_to(graph: torch._C.Graph, before: Node, x: Value, device: torch.device) -> Value:
    """``aten::to(x, device, None, False, False)`` inserted before ``before``; its output."""
    g: Any = graph  # torch's stubs omit Graph.insertConstant
    with graph.insert_point_guard(before):
        args = [g.insertConstant(v) for v in (device, None, False, False)]
        to = graph.create("aten::to", [x, *args], 1)
        graph.insertNode(to)
    to.output().setType(x.type())
    return to.output()


def _first_top_level_user(value: Value) -> Node | None:
    """The earliest node of the graph's own block that uses ``value``, directly or in a block."""
    first: Node | None = None
    for use in value.uses():
        node = use.user
        while node.owningBlock().owningNode() is not None:
            node = node.owningBlock().owningNode()
        if first is None or node.isBefore(first):
            first = node
    return first


def _move_inputs(graph: torch._C.Graph, skips: Skips) -> int:
    moved = 0
    for value in list(graph.inputs())[1:]:  # input 0 is self
        if not _is_tensor(value):
            if _holds_tensor(value):
                skips.add(f"input of type {value.type()} not moved to Vulkan")
            continue
        user = _first_top_level_user(value)
        if user is None:
            continue  # unused: nothing to move (upstream skips these too)
        moved_value = insert_to(graph, user, value, GPU)
        value.replaceAllUsesAfterNodeWith(moved_value.node(), moved_value)
        moved += 1
    return moved


def _move_outputs(graph: torch._C.Graph, skips: Skips) -> int:
    moved = 0
    ret = graph.return_node()
    for i, value in enumerate(list(ret.inputs())):
        if _is_tensor(value):
            ret.replaceInput(i, insert_to(graph, ret, value, CPU))
            moved += 1
        elif value.node().kind() == "prim::TupleConstruct" and len(value.uses()) == 1:
            tuple_node = value.node()
            for j, element in enumerate(list(tuple_node.inputs())):
                if _is_tensor(element):
                    tuple_node.replaceInput(j, insert_to(graph, tuple_node, element, CPU))
                    moved += 1
                elif _holds_tensor(element):
                    skips.add(f"output element of type {element.type()} not moved to the CPU")
        elif _holds_tensor(value):
            skips.add(f"output of type {value.type()} not moved to the CPU")
    return moved


class InsertGpuTransfers(ScriptPass):
    """Move tensor inputs to Vulkan and tensor outputs back to the CPU, in every method.

    Marks the module ``requires_backend_transfers = False``. Leaves, reported, inputs and outputs
    that hold tensors in other types (optional, list, nested).
    """

    optimization = MobileOptimizerType.VULKAN_AUTOMATIC_GPU_TRANSFER
    summary = "tensor inputs -> aten::to(x, 'vulkan'); tensor outputs -> aten::to(y, 'cpu')"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        moved, skips = 0, Skips()
        for method in ctx.methods:
            graph = module._c._get_method(method).graph
            moved += _move_inputs(graph, skips) + _move_outputs(graph, skips)
        if module._c.hasattr(MARK):
            module._c.setattr(MARK, False)
        else:
            module._c._register_attribute(MARK, torch._C.BoolType.get(), False)
        return PassResult(module, moved, dict(skips))
