"""fuse_clamp: a clamping activation after a prepacked run op fused into its prepack call's bounds.

    ctx = prepack(W, b, ..., None, None); y = run(x, ctx); z = act(y)
      ->  ctx = prepack(W, b, ..., lo, hi); z = run(x, ctx)

Each activation kind's bounds, in the slots of every backend table (XNNPACK's linear, conv2d and
transposed conv, Metal's linear and conv2d, Vulkan's conv2d context): counts of the activation
kinds (gone), the prepack call's bound arguments, numerics against a float64 eager reference
(the prepack ops run on every call: nothing is folded here). And every refusal with its reason:
bounds that are not constants, tensor bounds, crossed or equal bounds, bounds already set, a run
output read by another op, a packed context shared by several runs (clamping it would clamp the
other runs too), and a context the expected prepack op did not make in this graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxmobile
from fxmobile.backends.library import OpFamily, ensure_registered
from fxmobile.backends.metal.pipeline import PREPACK as METAL
from fxmobile.backends.vulkan.insert_prepacked_ops import CREATE_KINDS, InsertVulkanOps
from fxmobile.backends.vulkan.pipeline import CLAMP_SLOTS as VULKAN_SLOTS
from fxmobile.backends.xnnpack.pipeline import PREPACK as XNNPACK
from fxmobile.options import MobileOptimizerType
from fxmobile.script.fold_prepacking import FoldPrepacking
from fxmobile.script.fuse_clamp import ClampSlots, FuseClamp, clamp_slots
from fxmobile.script.insert_prepacked_ops import InsertPrepackedOps, Prepack
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.script.common import CTX, frozen, kinds, nodes_of

MEMBER = MobileOptimizerType.INSERT_FOLD_PREPACK_OPS
CLAMPS = {
    "aten::relu", "aten::relu_", "aten::relu6", "aten::relu6_", "aten::hardtanh",
    "aten::hardtanh_", "aten::clamp", "aten::clamp_", "aten::clamp_min", "aten::clamp_min_",
    "aten::clamp_max", "aten::clamp_max_",
}  # fmt: skip


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    for family in (OpFamily.XNNPACK, OpFamily.METAL, OpFamily.VULKAN):
        ensure_registered(family)


def prepacked(
    model: nn.Module, ctx: ScriptContext = CTX, table: Sequence[Prepack] = XNNPACK
) -> torch.jit.ScriptModule:
    """``model`` frozen, with the table's prepack + run pairs inserted (not folded)."""
    module = frozen(model, tuple(m for m in ctx.methods if m != "forward"))
    return InsertPrepackedOps(table, MEMBER).call(module, ctx).unit


def xnnpack_fuse() -> FuseClamp:
    return FuseClamp(clamp_slots(XNNPACK), MEMBER)


def bounds(
    module: torch.jit.ScriptModule, kind: str, method: str = "forward"
) -> list[tuple[object, object]]:
    """(min, max) arguments of every ``kind`` prepack call, in graph order."""
    return [
        (
            node.inputsAt(node.inputsSize() - 2).toIValue(),
            node.inputsAt(node.inputsSize() - 1).toIValue(),
        )
        for node in nodes_of(module, kind, method)
    ]


class Activated(nn.Module):
    """A conv, a transposed conv and a linear, each followed by ``act``."""

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.up = nn.ConvTranspose2d(6, 4, 3, stride=2)
        self.fc = nn.Linear(4, 6)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.up(self.act(self.conv(x))))
        return self.act(self.fc(y.mean((2, 3))))


class Relu(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(y)


class ReluInPlace(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.relu_(y)


class Relu6(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return F.relu6(y)


class Relu6InPlace(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return F.relu6(y, inplace=True)


class Hardtanh(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(y, -0.5, 0.25)


class HardtanhInPlace(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return F.hardtanh_(y, -0.5, 0.25)


class Clamp(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.clamp(y, -0.1, 0.2)


class ClampInPlace(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.clamp_(y, -0.1, 0.2)


class ClampMinOnly(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.clamp(y, min=0.05)


class ClampMin(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.clamp_min(y, 0.05)


class ClampMinInPlace(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y.clamp_min_(0.05)


class ClampMax(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.clamp_max(y, 0.3)


class ClampMaxInPlace(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y.clamp_max_(0.3)


# activation -> (the kind it scripts to, the bounds it fuses as)
ACTIVATIONS: dict[str, tuple[type[nn.Module], str, tuple[object, object]]] = {
    "relu": (Relu, "aten::relu", (0.0, None)),
    "relu_": (ReluInPlace, "aten::relu_", (0.0, None)),
    "relu6": (Relu6, "aten::relu6", (0.0, 6.0)),
    "relu6_": (Relu6InPlace, "aten::relu6_", (0.0, 6.0)),
    "hardtanh": (Hardtanh, "aten::hardtanh", (-0.5, 0.25)),
    "hardtanh_": (HardtanhInPlace, "aten::hardtanh_", (-0.5, 0.25)),
    "clamp": (Clamp, "aten::clamp", (-0.1, 0.2)),
    "clamp_": (ClampInPlace, "aten::clamp_", (-0.1, 0.2)),
    "clamp min only": (ClampMinOnly, "aten::clamp", (0.05, None)),
    "clamp_min": (ClampMin, "aten::clamp_min", (0.05, None)),
    "clamp_min_": (ClampMinInPlace, "aten::clamp_min_", (0.05, None)),
    "clamp_max": (ClampMax, "aten::clamp_max", (None, 0.3)),
    "clamp_max_": (ClampMaxInPlace, "aten::clamp_max_", (None, 0.3)),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_each_clamping_activation_fuses_into_every_xnnpack_op(name: str) -> None:
    act, kind, fused = ACTIVATIONS[name]
    model = Activated(act()).eval()
    module = prepacked(model)
    assert kinds(module)[kind] == 3
    result = xnnpack_fuse().call(module, CTX)
    assert result.rewrites == 3 and result.skips == {}
    assert not CLAMPS & set(kinds(result.unit))
    for prepack in (
        "prepacked::conv2d_clamp_prepack",
        "prepacked::conv2d_transpose_clamp_prepack",
        "prepacked::linear_clamp_prepack",
    ):
        assert bounds(result.unit, prepack) == [fused]
    assert_equivalent(model, result.unit, torch.randn(1, 3, 9, 9) * 4)


def test_metal_table_takes_the_bounds_in_its_slots() -> None:
    class ConvLinear(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 6, 3)
            self.fc = nn.Linear(6, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.hardtanh(self.conv(x), -0.5, 0.25)
            return torch.relu(self.fc(y.mean((2, 3))))

    model = ConvLinear().eval()
    module = prepacked(model, table=METAL)
    result = FuseClamp(clamp_slots(METAL), None).call(module, CTX)
    assert result.rewrites == 2 and result.skips == {}
    assert not CLAMPS & set(kinds(result.unit))
    assert bounds(result.unit, "metal_prepack::conv2d_prepack") == [(-0.5, 0.25)]
    assert bounds(result.unit, "metal_prepack::linear_prepack") == [(0.0, None)]
    assert_equivalent(model, result.unit, torch.randn(1, 3, 9, 9) * 4)


def test_clamp_slots_follow_the_prepack_call_arguments() -> None:
    assert clamp_slots(XNNPACK) == {
        "prepacked::linear_clamp_run": ClampSlots("prepacked::linear_clamp_prepack", 2, 3),
        "prepacked::conv2d_clamp_run": ClampSlots("prepacked::conv2d_clamp_prepack", 6, 7),
        "prepacked::conv2d_transpose_clamp_run": ClampSlots(
            "prepacked::conv2d_transpose_clamp_prepack", 7, 8
        ),
    }


def test_vulkan_conv2d_context_takes_the_bounds_and_its_linear_does_not() -> None:
    model = Activated(Hardtanh()).eval()
    module = InsertVulkanOps().call(frozen(model), CTX).unit
    result = FuseClamp(VULKAN_SLOTS, None).call(module, CTX)
    assert result.rewrites == 1 and result.skips == {}
    after = kinds(result.unit)
    assert after["aten::hardtanh"] == 2  # after the transposed conv and the linear
    (create,) = nodes_of(result.unit, "vulkan_prepack::create_conv2d_context")
    assert (create.inputsAt(6).toIValue(), create.inputsAt(7).toIValue()) == (-0.5, 0.25)
    assert "vulkan_prepack::create_conv2d_context" in CREATE_KINDS
    assert_equivalent(model, result.unit, torch.randn(1, 3, 9, 9) * 4)


class Conv(nn.Module):
    """One conv followed by ``act``; ``act`` may read the input too."""

    def __init__(self, act: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x), x)


class InputBound(nn.Module):
    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(y, min=float(x.mean()))


class InputHardtanh(nn.Module):
    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(y, -1.0, float(x.max()))


class TensorBound(nn.Module):
    if TYPE_CHECKING:  # buffers, for mypy; TorchScript cannot read string annotations
        lo: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("lo", torch.tensor(0.1))

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(y, self.lo)


class Crossed(nn.Module):
    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(y, 1.0, -1.0)  # min > max: every value becomes max


class ReluThenHardtanh(nn.Module):
    """Upstream #35705: clamping twice is not one clamp with the second's bounds."""

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(torch.relu(y), -2.0, 0.5)


class ReadTwice(nn.Module):
    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(y) + y  # the unclamped values are needed too


# model -> (rewrites, skip reason, activation kinds left)
LEFT_ALONE = {
    "non-constant bound": (InputBound, 0, "aten::clamp bounds are not constants", "aten::clamp"),
    "non-constant hardtanh bound": (
        InputHardtanh, 0, "aten::hardtanh bounds are not constants", "aten::hardtanh"
    ),
    "tensor bound": (TensorBound, 0, "aten::clamp bounds are tensors", "aten::clamp"),
    "crossed bounds": (Crossed, 0, "aten::clamp bounds cross (min > max)", "aten::clamp"),
    "bounds already set": (
        ReluThenHardtanh, 1, "prepacked::conv2d_clamp_prepack bounds already set", "aten::hardtanh"
    ),
    "output read twice": (ReadTwice, 0, "prepacked::conv2d_clamp_run output has 2 users",
                          "aten::relu"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(LEFT_ALONE))
def test_a_clamp_that_cannot_fuse_stays_with_its_reason(name: str) -> None:
    act, rewrites, reason, kind = LEFT_ALONE[name]
    model = Conv(act()).eval()
    result = xnnpack_fuse().call(prepacked(model), CTX)
    assert result.rewrites == rewrites and result.skips == {reason: 1}
    assert kinds(result.unit)[kind] == 1
    assert_equivalent(model, result.unit, torch.randn(1, 3, 5, 5) * 3)


class SharedConv(nn.Module):
    """One conv called twice, only the first call clamped."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)) + self.conv(-x)


def share_first_context(module: torch.jit.ScriptModule, prepack: str, run: str) -> None:
    """Point every ``run`` at the first ``prepack`` call's context (what common subexpression
    elimination makes of two identical prepack calls), and drop the others."""
    first, *others = nodes_of(module, prepack)
    for node in nodes_of(module, run)[1:]:
        node.replaceInput(1, first.output())
    for node in others:
        node.destroy()


def test_a_context_shared_by_several_runs_is_not_clamped() -> None:
    """Clamping the shared context would clamp the unclamped run as well (off by 1.49 of the
    output's scale when the refusal was removed)."""
    model = SharedConv().eval()
    module = prepacked(model)
    share_first_context(module, "prepacked::conv2d_clamp_prepack", "prepacked::conv2d_clamp_run")
    assert kinds(module)["prepacked::conv2d_clamp_prepack"] == 1
    assert kinds(module)["prepacked::conv2d_clamp_run"] == 2
    result = xnnpack_fuse().call(module, CTX)
    assert_equivalent(model, result.unit, torch.randn(1, 3, 5, 5) * 3)
    assert result.rewrites == 0
    assert result.skips == {"packed context is shared by several runs": 1}
    assert kinds(result.unit)["aten::relu"] == 1
    assert bounds(result.unit, "prepacked::conv2d_clamp_prepack") == [(None, None)]


def test_a_context_not_made_by_the_prepack_op_in_this_graph_is_not_clamped() -> None:
    """After prepack folding the run reads its context from an attribute: its bounds are fixed."""
    model = Activated(Relu()).eval()
    module = prepacked(model)
    folded = FoldPrepacking(InsertPrepackedOps(XNNPACK, MEMBER).prepack_kinds, MEMBER)
    module = folded.call(module, CTX).unit
    result = xnnpack_fuse().call(module, CTX)
    assert result.rewrites == 0
    assert result.skips == {
        "prepacked::conv2d_clamp_run context is not made by prepacked::conv2d_clamp_prepack "
        "in this graph": 1,
        "prepacked::conv2d_transpose_clamp_run context is not made by "
        "prepacked::conv2d_transpose_clamp_prepack in this graph": 1,
        "prepacked::linear_clamp_run context is not made by prepacked::linear_clamp_prepack "
        "in this graph": 1,
    }
    assert kinds(result.unit)["aten::relu"] == 3
    assert_equivalent(model, result.unit, torch.randn(1, 3, 9, 9))


def test_a_context_made_by_another_prepack_op_is_not_clamped() -> None:
    """A table whose run op is fed by some other op's output: the slots are not that op's."""
    model = Activated(Relu()).eval()
    slots = {"prepacked::conv2d_clamp_run": ClampSlots("prepacked::linear_clamp_prepack", 2, 3)}
    result = FuseClamp(slots, MEMBER).call(prepacked(model), CTX)
    assert result.rewrites == 0
    assert result.skips == {
        "prepacked::conv2d_clamp_run context is not made by prepacked::linear_clamp_prepack "
        "in this graph": 1
    }
    assert_equivalent(model, result.unit, torch.randn(1, 3, 9, 9))


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.conv(torch.relu(x)))


def test_an_activation_not_after_a_run_and_a_run_without_one_are_not_candidates() -> None:
    model = Plain().eval()
    result = xnnpack_fuse().call(prepacked(model), CTX)
    assert result.rewrites == 0 and result.skips == {} and not result.modified
    assert kinds(result.unit)["aten::relu"] == 1


class WithExport(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)

    @torch.jit.export
    def clamped(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu6(self.conv(x))


def test_every_rewritten_method_is_fused() -> None:
    model = WithExport().eval()
    ctx = ScriptContext(("forward", "clamped"), ("clamped",))
    result = xnnpack_fuse().call(prepacked(model, ctx), ctx)
    assert result.rewrites == 1
    assert bounds(result.unit, "prepacked::conv2d_clamp_prepack", "clamped") == [(0.0, 6.0)]
    assert kinds(result.unit, "clamped")["aten::relu6"] == 0
    x = torch.randn(1, 3, 4, 4) * 8
    assert_equivalent(model.clamped, result.unit.clamped, x)
    assert_equivalent(model, result.unit, x)


class Pinned(nn.Module):
    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(y, 0.5, 0.5)  # min == max: every value becomes 0.5


def test_equal_bounds_are_left_alone() -> None:
    """clamp(y, 0.5, 0.5) was fused, and XNNPACK's prepack then refused it ("output_max must be
    greater than output_min"): fold_prepacking failed and optimize_for_mobile with it."""
    model = Conv(Pinned()).eval()
    result = xnnpack_fuse().call(prepacked(model), CTX)
    assert result.rewrites == 0 and result.skips == {"aten::clamp bounds meet (min == max)": 1}
    assert kinds(result.unit)["aten::clamp"] == 1
    folded = FoldPrepacking(InsertPrepackedOps(XNNPACK, MEMBER).prepack_kinds, MEMBER)
    module = folded.call(result.unit, CTX).unit  # runs the prepack op
    assert_equivalent(model, module, torch.randn(1, 3, 5, 5))


def test_equal_bounds_leave_the_cpu_pipeline_working() -> None:
    model = Conv(Pinned()).eval()
    optimized = fxmobile.optimize_for_mobile(model)
    assert_equivalent(model, optimized, torch.randn(1, 3, 5, 5))


def test_a_run_whose_output_is_unused_is_not_a_candidate() -> None:
    model = Conv(ReadTwice()).eval()
    module = prepacked(model)
    (run,) = nodes_of(module, "prepacked::conv2d_clamp_run")
    run.output().replaceAllUsesWith(list(module.graph.inputs())[1])  # the run is now dead code
    result = xnnpack_fuse().call(module, CTX)
    assert result.rewrites == 0 and result.skips == {}


def test_the_pass_is_switched_off_by_its_backends_member() -> None:
    assert xnnpack_fuse().blocked_by() == {MEMBER}
    assert FuseClamp(VULKAN_SLOTS, None).blocked_by() == frozenset()
    assert xnnpack_fuse().name == "fuse_clamp"
