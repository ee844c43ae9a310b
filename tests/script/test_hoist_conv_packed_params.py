"""hoist_conv_packed_params (XNNPACK): quantized convs' packed params read from the root module.

    prim::GetAttr[name="_packed_params"](prim::GetAttr[name="conv"](self))
      ->  prim::GetAttr[name="_jit_pass_hoist_conv_packed_params.conv._packed_params.1"](self)

then a second freeze drops the emptied conv modules. Counts of the hoisted reads and of the
quantized conv modules left, upstream's attribute names, bit-exact numerics against the quantized
eager model (the same kernels run), and what stays: float convs, quantized linears, and every
conv once freezing has already folded the packed params into constants (torch 2.15).
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from fxmobile.backends.xnnpack.hoist_conv_packed_params import (
    PREFIX,
    HoistConvPackedParams,
    hoist_packed_params,
)
from fxmobile.script.jit_passes import jit
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.script.common import CTX, frozen, scripted


@pytest.fixture(autouse=True)
def _qnnpack() -> Iterator[None]:
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "qnnpack"
    yield
    torch.backends.quantized.engine = previous


class Q(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.conv = nn.Conv2d(3, 4, 3)
        self.inner = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU())
        self.fc = nn.Linear(4, 2)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(self.conv(self.quant(x)))
        return self.dequant(self.fc(y.mean((2, 3))))

    @torch.jit.export
    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.dequant(self.conv(self.quant(x)))


def quantized() -> Q:
    torch.manual_seed(0)
    model = Q().eval()
    model.qconfig = torch.ao.quantization.get_default_qconfig("qnnpack")
    torch.ao.quantization.fuse_modules(model, [["inner.0", "inner.1"]], inplace=True)
    torch.ao.quantization.prepare(model, inplace=True)
    model(torch.randn(4, 3, 8, 8))
    converted = torch.ao.quantization.convert(model)
    assert isinstance(converted, Q)
    return converted


def unfrozen(model: nn.Module) -> torch.jit.ScriptModule:
    """Scripted, loaded back (types of its own) and inlined: the GetAttr chains are there."""
    module = torch.jit.load(io.BytesIO(scripted(model).save_to_buffer()))
    for name in ("forward", "features"):
        jit._jit_pass_inline(module._c._get_method(name).graph)
    return module


def test_packed_params_are_read_from_root_attributes_named_as_upstream_names_them() -> None:
    model = quantized()
    module = unfrozen(model)
    assert hoist_packed_params(module, ["forward"]) == 2
    assert module._c.hasattr(f"{PREFIX}.conv._packed_params.1")
    assert module._c.hasattr(f"{PREFIX}.inner.0._packed_params.2")  # the fused ConvReLU2d
    reads = [
        n.s("name")
        for n in module.graph.nodes()
        if n.kind() == "prim::GetAttr" and "_packed_params" in n.s("name")
    ]
    assert sorted(reads) == [
        f"{PREFIX}.conv._packed_params.1",
        f"{PREFIX}.inner.0._packed_params.2",
        "_packed_params",  # the quantized linear's LinearPackedParams: not a conv, left alone
        "_packed_params",
    ]
    assert all(
        n.inputsAt(0).debugName().startswith("self")
        for n in module.graph.nodes()
        if n.kind() == "prim::GetAttr" and n.s("name").startswith(PREFIX)
    )
    x = torch.randn(1, 3, 8, 8)
    assert torch.equal(module(x), model(x))


def test_the_pass_hoists_then_freezes_the_emptied_convs_away() -> None:
    model = quantized()
    result = HoistConvPackedParams().call(unfrozen(model), CTX)
    assert result.rewrites == 2 and result.skips == {}
    assert not list(result.unit.children())
    x = torch.randn(1, 3, 8, 8)
    assert torch.equal(result.unit(x), model(x))


def test_every_method_is_hoisted_and_the_counter_runs_on() -> None:
    model = quantized()
    ctx = ScriptContext(("forward", "features"), ("features",))
    result = HoistConvPackedParams().call(unfrozen(model), ctx)
    assert result.rewrites == 3
    x = torch.randn(1, 3, 8, 8)
    assert torch.equal(result.unit.features(x), model.features(x))
    assert torch.equal(result.unit(x), model(x))


def test_frozen_module_has_nothing_left_to_hoist() -> None:
    """torch 2.15's freezing folds the packed params into constants already."""
    model = quantized()
    result = HoistConvPackedParams().call(frozen(model), CTX)
    assert result.rewrites == 0 and not result.modified
    x = torch.randn(1, 3, 8, 8)
    assert torch.equal(result.unit(x), model(x))


def test_float_convs_are_not_candidates() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    module = unfrozen_float(model)
    result = HoistConvPackedParams().call(module, CTX)
    assert result.rewrites == 0 and list(result.unit.children())
    assert_equivalent(model, result.unit, torch.randn(1, 3, 6, 6))


def unfrozen_float(model: nn.Module) -> torch.jit.ScriptModule:
    module = torch.jit.load(io.BytesIO(scripted(model).save_to_buffer()))
    jit._jit_pass_inline(module.graph)
    return module
