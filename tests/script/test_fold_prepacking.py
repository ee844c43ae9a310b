"""fold_prepacking: constant-input prepack calls run once, their contexts stored on the module.

    ctx = prepack(W, b, ...)  (all constant);  y = run(x, ctx)
      ->  y = run(x, self.prepack_folding_<method>._jit_pass_packed_weight_<N>)

Counts of the prepack kinds (gone) and of ``prim::GetAttr`` reads of the stored contexts
(there), the attribute names (upstream's), the stored contexts' state (the prepack call's
arguments, bounds included), numerics against a float64 eager reference, for XNNPACK's, Metal's
and Vulkan's prepack ops; and a prepack call with a non-constant input, which stays with its
reason.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxmobile
from fxmobile.backends.library import OpFamily, ensure_registered
from fxmobile.backends.metal.pipeline import PREPACK as METAL
from fxmobile.backends.vulkan.insert_prepacked_ops import CREATE_KINDS, InsertVulkanOps
from fxmobile.backends.xnnpack.pipeline import PREPACK as XNNPACK
from fxmobile.infra import Status
from fxmobile.options import MobileOptimizerType
from fxmobile.script.fold_prepacking import FoldPrepacking
from fxmobile.script.fuse_clamp import FuseClamp, clamp_slots
from fxmobile.script.insert_prepacked_ops import InsertPrepackedOps, Prepack
from fxmobile.script.jit_passes import jit
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.script.common import CTX, frozen, kinds, nodes_of

MEMBER = MobileOptimizerType.INSERT_FOLD_PREPACK_OPS


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    for family in (OpFamily.XNNPACK, OpFamily.METAL, OpFamily.VULKAN):
        ensure_registered(family)


def prepacked(
    model: nn.Module, table: tuple[Prepack, ...] = XNNPACK, ctx: ScriptContext = CTX
) -> torch.jit.ScriptModule:
    module = frozen(model, tuple(m for m in ctx.methods if m != "forward"))
    return InsertPrepackedOps(table, MEMBER).call(module, ctx).unit


def fold(table: tuple[Prepack, ...] = XNNPACK) -> FoldPrepacking:
    return FoldPrepacking(InsertPrepackedOps(table, MEMBER).prepack_kinds, MEMBER)


def stored(module: torch.jit.ScriptModule) -> dict[str, Any]:
    """The packed contexts folding stored, by name. Any: they are torch.ScriptObjects, whose
    TorchScript ``__getstate__`` (the weight first) torch's stubs cannot see."""
    return {
        name: value
        for name, value in jit._jit_debug_module_iterators(module._c)["named_attributes"]
        if name.startswith("prepack_folding")
    }


class Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, groups=2)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(torch.relu(self.conv(x)))
        return self.fc(y.mean((2, 3)))


def test_xnnpack_prepack_calls_become_stored_contexts() -> None:
    model = Layers().eval()
    module = prepacked(model)
    module = FuseClamp(clamp_slots(XNNPACK), MEMBER).call(module, CTX).unit
    result = fold().call(module, CTX)
    assert result.rewrites == 3 and result.skips == {}
    after = kinds(result.unit)
    assert not [k for k in after if k.endswith("_prepack")]
    assert after["prim::GetAttr"] == 3
    assert after["prepacked::conv2d_clamp_run"] == 1 and after["prepacked::linear_clamp_run"] == 1
    names = [n.s("name") for n in nodes_of(result.unit, "prim::GetAttr")]
    assert names == [f"prepack_folding_forward._jit_pass_packed_weight_{i}" for i in range(3)]
    states = {name: ctx.__getstate__()[0] for name, ctx in stored(result.unit).items()}
    conv = states["prepack_folding_forward._jit_pass_packed_weight_0"]
    torch.testing.assert_close(conv[0], model.conv.weight, rtol=0, atol=0)
    assert list(conv[2:]) == [[2, 2], [1, 1], [1, 1], 1, 0.0, None]  # the fused relu's bounds
    assert_equivalent(model, result.unit, torch.randn(2, 3, 16, 16))


def test_metal_prepack_calls_become_stored_contexts() -> None:
    model = Layers().eval()
    result = fold(METAL).call(prepacked(model, METAL), CTX)
    assert result.rewrites == 2 and result.skips == {}
    after = kinds(result.unit)
    assert not [k for k in after if k.endswith("_prepack")]
    assert after["metal_prepack::conv2d_run"] == after["metal_prepack::linear_run"] == 1
    assert len(stored(result.unit)) == 2
    assert_equivalent(model, result.unit, torch.randn(2, 3, 16, 16))


def test_vulkan_create_calls_become_stored_contexts() -> None:
    model = Layers().eval()
    module = InsertVulkanOps().call(frozen(model), CTX).unit
    result = FoldPrepacking(CREATE_KINDS, None).call(module, CTX)
    assert result.rewrites == 3 and result.skips == {}
    assert not [k for k in kinds(result.unit) if "create_" in k]
    assert len(stored(result.unit)) == 3
    assert_equivalent(model, result.unit, torch.randn(2, 3, 16, 16))


class WithExport(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)

    @torch.jit.export
    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3)))


def test_each_method_stores_its_own_contexts_under_its_name() -> None:
    model = WithExport().eval()
    ctx = ScriptContext(("forward", "features"), ("features",))
    result = fold().call(prepacked(model, ctx=ctx), ctx)
    assert result.rewrites == 3
    assert sorted(stored(result.unit)) == [
        "prepack_folding_features._jit_pass_packed_weight_0",
        "prepack_folding_features._jit_pass_packed_weight_1",
        "prepack_folding_forward._jit_pass_packed_weight_0",
    ]
    x = torch.randn(1, 3, 6, 6)
    assert_equivalent(model, result.unit, x)
    assert_equivalent(model.features, result.unit.features, x)


def test_names_already_taken_are_skipped_not_overwritten() -> None:
    """Folding twice (a second prepack inserted later) must not replace a stored context."""
    model = Layers().eval()
    first = fold().call(prepacked(model), CTX).unit
    taken = stored(first)
    graph = first.graph
    (run,) = nodes_of(first, "prepacked::linear_clamp_run")
    # a fresh prepack call for the linear, as a later rewrite might insert
    g: object = graph
    with graph.insert_point_guard(run):
        none = g.insertConstant(None)  # type: ignore[attr-defined]
        weight = g.insertConstant(model.fc.weight.detach())  # type: ignore[attr-defined]
        bias = g.insertConstant(model.fc.bias.detach())  # type: ignore[attr-defined]
        packed = g.insert("prepacked::linear_clamp_prepack", [weight, bias, none, none])  # type: ignore[attr-defined]
    run.replaceInput(1, packed)
    again = fold().call(first, CTX)
    assert again.rewrites == 1
    now = stored(again.unit)
    assert set(now) == set(taken) | {"prepack_folding_forward._jit_pass_packed_weight_3"}
    for name, context in taken.items():  # the stored contexts are the ones folded first
        assert torch.equal(now[name].__getstate__()[0][0], context.__getstate__()[0][0])
    assert_equivalent(model, again.unit, torch.randn(2, 3, 16, 16))


class DynamicWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.conv2d(x, self.w * x.mean()).mean((2, 3)))


def test_a_prepack_call_with_a_non_constant_input_stays_with_its_reason() -> None:
    model = DynamicWeight().eval()
    result = fold().call(prepacked(model), CTX)
    assert result.rewrites == 1
    assert result.skips == {
        "prepacked::conv2d_clamp_prepack has a non-constant input (repacks on every call)": 1
    }
    after = kinds(result.unit)
    assert after["prepacked::conv2d_clamp_prepack"] == 1
    assert after["prepacked::linear_clamp_prepack"] == 0
    assert_equivalent(model, result.unit, torch.randn(1, 3, 6, 6))


def test_nothing_to_do_reports_zero() -> None:
    result = fold().call(frozen(nn.Sequential(nn.ReLU())), CTX)
    assert result.rewrites == 0 and not result.modified and result.skips == {}


def test_the_cpu_pipelines_folding_goes_with_its_blocklist_member() -> None:
    """Upstream's INSERT_FOLD_PREPACK_OPS switches prepacking and its folding off together."""
    x = torch.randn(1, 3, 8, 8)
    report = fxmobile.optimize(Layers().eval(), {MEMBER}, example_inputs=x).report
    for name in ("insert_prepacked_ops", "fuse_clamp", "fold_prepacking"):
        record = report.record(name)
        assert (record.status, record.member) == (Status.BLOCKLISTED, MEMBER.name)
