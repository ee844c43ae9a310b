"""remove_mutation (Vulkan, Metal): in-place ops as their functional forms where no alias sees it.

    y = relu_(x) -> y = relu(x)   (x not read afterwards, not an alias);  add_(x, b) -> add(x, b)

The count is the number of writing nodes that went: counts of the in-place and functional
kinds, numerics against a float64 eager reference, and the writes torch cannot prove unseen (to
a graph input, or read again through an alias), which stay and are reported under their op.
"""

from __future__ import annotations

import torch
from torch import nn

from fxmobile.script.remove_mutation import RemoveMutation, mutating_kinds
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.script.common import CTX, frozen, kinds


class InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y.add_(1)
        y.mul_(0.5)
        return y.sigmoid_()


def test_writes_nothing_else_sees_become_functional() -> None:
    model = InPlace().eval()
    module = frozen(model)
    assert mutating_kinds(module, ["forward"]) == {
        "aten::add_": 1,
        "aten::mul_": 1,
        "aten::sigmoid_": 1,
    }
    result = RemoveMutation().call(module, CTX)
    assert result.rewrites == 3 and result.skips == {}
    after = kinds(result.unit)
    assert after["aten::add"] == after["aten::mul"] == after["aten::sigmoid"] == 1
    assert not {"aten::add_", "aten::mul_", "aten::sigmoid_"} & set(after)
    assert_equivalent(model, result.unit, torch.randn(1, 3, 4, 4))


class CallersTensor(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.relu_()
        x.mul_(3)  # the caller's tensor: the write must stay
        return y + x


def test_a_write_to_an_input_stays_and_is_reported() -> None:
    model = CallersTensor()
    result = RemoveMutation().call(frozen(model), CTX)
    assert result.rewrites == 1
    assert result.skips == {"aten::mul_ kept: torch cannot prove no alias observes the write": 1}
    after = kinds(result.unit)
    assert after["aten::mul_"] == 1 and after["aten::relu"] == 1 and after["aten::relu_"] == 0
    x = torch.randn(5)
    given, expected_input = x.clone(), x.clone()
    assert torch.equal(result.unit(given), model(expected_input))
    assert torch.equal(given, expected_input)  # both wrote the caller's tensor the same way


class ReadThroughAView(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        y = a * 2
        v = y.view(-1)
        y.add_(1)
        return v * 3  # reads the write through the view


def test_a_write_read_again_through_a_view_stays() -> None:
    model = ReadThroughAView()
    result = RemoveMutation().call(frozen(model), CTX)
    assert result.rewrites == 0
    assert result.skips == {"aten::add_ kept: torch cannot prove no alias observes the write": 1}
    assert_equivalent(model, result.unit, torch.randn(2, 3))


def test_every_rewritten_method_is_made_functional() -> None:
    class WithExport(InPlace):
        @torch.jit.export
        def other(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x).relu_()

    model = WithExport().eval()
    ctx = ScriptContext(("forward", "other"), ("other",))
    result = RemoveMutation().call(frozen(model, ("other",)), ctx)
    assert result.rewrites == 4
    assert kinds(result.unit, "other")["aten::relu_"] == 0
    x = torch.randn(1, 3, 4, 4)
    assert_equivalent(model.other, result.unit.other, x)


def test_nothing_to_do_reports_zero() -> None:
    result = RemoveMutation().call(frozen(nn.Sequential(nn.ReLU())), CTX)
    assert result.rewrites == 0 and not result.modified and result.skips == {}


class AddsTwice(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(1)
        y.add_(2)
        x.add_(3)  # the caller's tensor: kept
        x.add_(4)
        return y


def test_writes_of_one_kind_are_counted_each() -> None:
    module = frozen(AddsTwice())
    assert mutating_kinds(module, ["forward"]) == {"aten::add_": 4}
    result = RemoveMutation().call(module, CTX)
    assert result.rewrites == 2
    assert result.skips == {"aten::add_ kept: torch cannot prove no alias observes the write": 2}
