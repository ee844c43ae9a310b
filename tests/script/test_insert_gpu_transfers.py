"""insert_gpu_transfers (Vulkan): tensor inputs moved to the GPU, tensor outputs moved back.

    %x -> aten::to(%x, vulkan, None, False, False) before its first top-level user
    return %y -> return aten::to(%y, cpu, None, False, False)   (also a returned tuple's tensors)

Counts of ``aten::to`` per device and where they sit, the module's
``requires_backend_transfers = False`` mark, and what is not moved, with its reason (inputs and
outputs holding tensors in other types). This machine has no Vulkan device: the numerics are
checked on the rewritten graph with every ``vulkan`` device constant turned into ``cpu``, which
runs the very same wiring (every use reads the moved tensor, every output the moved-back one).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fxmobile.backends.vulkan.insert_gpu_transfers import MARK, InsertGpuTransfers
from fxmobile.options import MobileOptimizerType
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.models import TwoInputs
from tests.script.common import CTX, frozen, kinds, nodes_of


def transfers(module: torch.jit.ScriptModule, method: str = "forward") -> list[tuple[str, str]]:
    """(the moved value's producer kind, the device) of each aten::to, in graph order."""
    return [
        (n.inputsAt(0).node().kind(), str(n.inputsAt(1).toIValue()))
        for n in nodes_of(module, "aten::to", method)
    ]


def on_cpu(module: torch.jit.ScriptModule, method: str = "forward") -> torch.jit.ScriptModule:
    """Every transfer to ``vulkan`` made a transfer to ``cpu``, in place; the module."""
    graph = module._c._get_method(method).graph
    g: Any = graph
    for node in nodes_of(module, "aten::to", method):
        if str(node.inputsAt(1).toIValue()) == "vulkan":
            with graph.insert_point_guard(node):
                node.replaceInput(1, g.insertConstant(torch.device("cpu")))
    return module


def test_used_tensor_inputs_move_to_vulkan_and_tensor_outputs_back() -> None:
    model = TwoInputs().eval()
    result = InsertGpuTransfers().call(frozen(model), CTX)
    assert result.rewrites == 2 and result.skips == {}
    # x moves; the unused tensor and the bool do not; the If's result moves back
    assert transfers(result.unit) == [("prim::Param", "vulkan"), ("prim::If", "cpu")]
    graph = result.unit.graph
    kinds_in_order = [n.kind() for n in graph.nodes()]
    assert kinds_in_order[kinds_in_order.index("aten::to") + 1] == "aten::conv2d"  # x's user
    x = list(graph.inputs())[1]
    assert [u.user.kind() for u in x.uses()] == ["aten::to"]
    assert graph.return_node().inputsAt(0).node().kind() == "aten::to"
    assert result.unit._c.getattr(MARK) is False
    assert InsertGpuTransfers().optimization is MobileOptimizerType.VULKAN_AUTOMATIC_GPU_TRANSFER
    inputs = (torch.randn(1, 3, 6, 6), torch.randn(2), True)
    assert_equivalent(model, on_cpu(result.unit), *inputs)


class NestedUse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, flag: bool) -> torch.Tensor:
        if flag:
            x = x * 2
        return self.conv(x) + x.mean()


def test_an_input_first_used_in_a_nested_block_moves_before_that_block() -> None:
    model = NestedUse().eval()
    result = InsertGpuTransfers().call(frozen(model), CTX)
    graph = result.unit.graph
    x = list(graph.inputs())[1]
    assert [u.user.kind() for u in x.uses()] == ["aten::to"]  # every use reads the moved tensor
    moved = x.uses()[0].user
    assert moved.owningBlock().owningNode() is None  # top level, before the If
    assert moved.isBefore(graph.findNode("prim::If"))  # type: ignore[attr-defined]  # stub lacks it
    assert [d for _, d in transfers(result.unit)] == ["vulkan", "cpu"]
    for flag in (True, False):
        assert_equivalent(model, on_cpu(result.unit), torch.randn(1, 3, 5, 5), flag)


class Pair(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a * 2, b + 1


def test_the_tensors_of_a_returned_tuple_move_back() -> None:
    model = Pair()
    result = InsertGpuTransfers().call(frozen(model), CTX)
    assert result.rewrites == 4 and result.skips == {}
    tuple_node = result.unit.graph.return_node().inputsAt(0).node()
    assert tuple_node.kind() == "prim::TupleConstruct"
    assert {v.node().kind() for v in tuple_node.inputs()} == {"aten::to"}
    assert [d for _, d in transfers(result.unit)] == ["vulkan", "vulkan", "cpu", "cpu"]
    assert_equivalent(model, on_cpu(result.unit), torch.randn(3), torch.randn(3))


class OtherTypes(nn.Module):
    def forward(
        self, x: torch.Tensor, maybe: torch.Tensor | None, many: list[torch.Tensor]
    ) -> tuple[list[torch.Tensor], torch.Tensor | None, torch.Tensor]:
        y = x + many[0]
        return [y, x], maybe, y * 2


def test_inputs_and_outputs_holding_tensors_in_other_types_stay_and_are_reported() -> None:
    model = OtherTypes()
    result = InsertGpuTransfers().call(frozen(model), CTX)
    assert result.rewrites == 2  # x in, y * 2 out
    assert result.skips == {
        "input of type Optional[Tensor] not moved to Vulkan": 1,
        "input of type List[Tensor] not moved to Vulkan": 1,
        "output element of type List[Tensor] not moved to the CPU": 1,
        "output element of type Optional[Tensor] not moved to the CPU": 1,
    }
    x, many = torch.randn(3), [torch.randn(3)]
    assert_equivalent(model, on_cpu(result.unit), x, None, many)


class ListOut(nn.Module):
    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x * 2]


def test_a_returned_list_stays_and_is_reported() -> None:
    result = InsertGpuTransfers().call(frozen(ListOut()), CTX)
    assert result.rewrites == 1
    assert result.skips == {"output of type List[Tensor] not moved to the CPU": 1}


def test_the_mark_is_set_when_the_module_already_has_it() -> None:
    model = Pair()
    module = frozen(model)
    module._c._register_attribute(MARK, torch._C.BoolType.get(), True)
    result = InsertGpuTransfers().call(module, CTX)
    assert result.unit._c.getattr(MARK) is False


def test_every_rewritten_method_moves_its_tensors() -> None:
    class WithExport(Pair):
        @torch.jit.export
        def single(self, x: torch.Tensor) -> torch.Tensor:
            return x - 1

    model = WithExport()
    ctx = ScriptContext(("forward", "single"), ("single",))
    result = InsertGpuTransfers().call(frozen(model, ("single",)), ctx)
    assert result.rewrites == 6
    assert [d for _, d in transfers(result.unit, "single")] == ["vulkan", "cpu"]
    x = torch.randn(3)
    assert_equivalent(model.single, on_cpu(result.unit, "single").single, x)


def test_a_module_without_tensor_inputs_or_outputs_moves_nothing() -> None:
    class Count(nn.Module):
        def forward(self, n: int) -> int:
            return n + 1

    result = InsertGpuTransfers().call(frozen(Count()), CTX)
    assert result.rewrites == 0 and result.skips == {}
    assert kinds(result.unit)["aten::to"] == 0
    assert result.unit._c.getattr(MARK) is False
