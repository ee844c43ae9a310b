"""conv1d_to_conv2d (XNNPACK): conv1d as unsqueeze -> conv2d -> squeeze, by torch's own pass.

Counts of ``aten::conv1d`` (gone) and ``aten::conv2d`` (there), numerics against a float64 eager
reference over strides, paddings, dilations and groups, and the methods it must leave whole,
with their reasons: a conv1d with string padding (torch's rewrite breaks the graph) and a
method that writes a tensor in place (torch's rewrite can move the conv past the write).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.backends.xnnpack.conv1d_to_conv2d import Conv1dToConv2d
from fxmobile.script.canonicalize import Canonicalize
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.script.common import CTX, frozen, kinds

CONVS = {
    "strided, dilated": nn.Conv1d(3, 6, 3, stride=2, padding=1, dilation=2),
    "grouped, no bias": nn.Conv1d(4, 6, 3, groups=2, bias=False),
    "pointwise": nn.Conv1d(3, 5, 1),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_conv1d_becomes_conv2d(name: str) -> None:
    model = nn.Sequential(CONVS[name], nn.ReLU()).eval()
    result = Conv1dToConv2d().call(frozen(model), CTX)
    assert result.rewrites == 1 and result.skips == {}
    after = kinds(result.unit)
    assert after["aten::conv1d"] == 0 and after["aten::conv2d"] == 1
    assert_equivalent(model, result.unit, torch.randn(2, CONVS[name].in_channels, 17))


class TwoConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv1d(2, 3, 3)
        self.b = nn.Conv1d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))

    @torch.jit.export
    def first(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)


def test_every_conv1d_of_every_method_is_counted() -> None:
    model = TwoConvs().eval()
    ctx = ScriptContext(("forward", "first"), ("first",))
    result = Conv1dToConv2d().call(frozen(model, ("first",)), ctx)
    assert result.rewrites == 3
    assert (
        kinds(result.unit)["aten::conv2d"] == 2 and kinds(result.unit, "first")["aten::conv2d"] == 1
    )
    x = torch.randn(1, 2, 9)
    assert_equivalent(model, result.unit, x)
    assert_equivalent(model.first, result.unit.first, x)


def test_conv1d_with_string_padding_is_left_alone() -> None:
    """Found by the fuzzer: torch's rewrite breaks the graph for padding='same'."""
    model = nn.Sequential(nn.Conv1d(2, 1, 1, padding="same"), nn.ReLU()).eval()
    result = Conv1dToConv2d().call(frozen(model), CTX)
    assert result.rewrites == 0 and result.skips == {"conv1d with string padding": 1}
    assert kinds(result.unit)["aten::conv1d"] == 1
    Canonicalize().call(result.unit, CTX)  # where the broken graph used to fail
    assert_equivalent(model, result.unit, torch.randn(1, 2, 3))


def test_one_string_padded_conv1d_leaves_the_whole_module_alone() -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.same = nn.Conv1d(2, 2, 3, padding="same")
            self.plain = nn.Conv1d(2, 2, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.plain(self.same(x))

    model = Mixed().eval()
    result = Conv1dToConv2d().call(frozen(model), CTX)
    assert result.rewrites == 0 and result.skips == {"conv1d with string padding": 1}
    assert kinds(result.unit)["aten::conv1d"] == 2
    assert_equivalent(model, result.unit, torch.randn(1, 2, 8))


class WritesFirst(nn.Module):
    """Found by the fuzzer: torch's rewrite placed the conv2d after ``hardtanh_`` had written
    its input; the write, then unused, went as dead code."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x * 2
        F.hardtanh_(v)
        return self.conv(v)


def test_a_method_that_writes_in_place_is_left_alone() -> None:
    model = WritesFirst().eval()
    result = Conv1dToConv2d().call(frozen(model), CTX)
    assert result.rewrites == 0 and result.skips == {"method writes tensors in place": 1}
    assert kinds(result.unit)["aten::conv1d"] == 1
    assert_equivalent(model, result.unit, torch.randn(1, 2, 5) * 3)


def test_writes_in_methods_without_a_conv1d_do_not_count() -> None:
    class WritesElsewhere(TwoConvs):
        @torch.jit.export
        def scaled(self, x: torch.Tensor) -> torch.Tensor:
            return x.mul_(2)

    model = WritesElsewhere().eval()
    ctx = ScriptContext(("forward", "scaled"), ("scaled",))
    result = Conv1dToConv2d().call(frozen(model, ("scaled",)), ctx)
    assert result.rewrites == 2 and result.skips == {}
    assert_equivalent(model, result.unit, torch.randn(1, 2, 9))


def test_nothing_to_do_reports_zero() -> None:
    model = nn.Sequential(nn.Conv2d(2, 2, 1)).eval()
    result = Conv1dToConv2d().call(frozen(model), CTX)
    assert result.rewrites == 0 and not result.modified and result.skips == {}
