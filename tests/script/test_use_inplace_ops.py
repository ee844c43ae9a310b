"""use_inplace_ops: elementwise results written into a tensor nothing else reads; every case
where a write could be seen is left alone, with the reason."""

from __future__ import annotations

import torch
from torch import nn

import fxmobile
from fxmobile.report.records import PassRecord
from fxmobile.script import use_inplace_ops as inplace
from tests.helpers import assert_equivalent, randomize_batchnorm


def _record(result: fxmobile.MobileResult) -> PassRecord:
    return next(p for p in result.report.passes if p.name == "use_inplace_ops")


def _kinds(module: torch.jit.ScriptModule) -> list[str]:
    return [n.kind() for n in module.graph.nodes()]


class _SqueezeExcite(nn.Module):
    """mobilenet_v3's pattern: a residual add and a squeeze-excitation mul after convs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.hardswish(self.bn(self.conv(x)))
        s = nn.functional.hardsigmoid(self.fc(y.mean((2, 3), keepdim=True)))
        return self.fc(self.conv(s * y) + x)


def test_squeeze_excite_and_residual_run_in_place() -> None:
    model = randomize_batchnorm(_SqueezeExcite()).eval()
    x = torch.randn(2, 4, 6, 6)
    for source in (model, torch.jit.script(model)):
        result = fxmobile.optimize(source, example_inputs=x)
        kinds = _kinds(result.module)
        assert "aten::mul_" in kinds and "aten::mul" not in kinds  # y.mul_(s): commuted
        assert "aten::hardsigmoid_" in kinds and "aten::hardsigmoid" not in kinds
        assert "aten::add_" in kinds and "aten::add" not in kinds  # into the conv's output
        assert_equivalent(model, result.module, x)
        assert torch.equal(x, x.clone())


class _Residual(nn.Module):
    """resnet's pattern: relu(conv(x) + x) before the next conv, fused to _add_relu, then
    written into the conv's output (the second operand, x, is the caller's)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        out += x
        return self.conv(torch.relu(out))


def test_fused_add_relu_runs_in_place() -> None:
    model = _Residual().eval()
    x = torch.randn(1, 4, 5, 5)
    result = fxmobile.optimize(model, example_inputs=x)
    kinds = _kinds(result.module)
    assert "aten::_add_relu_" in kinds and "aten::_add_relu" not in kinds
    assert_equivalent(model, result.module, x)


def test_float64_keeps_float64_numerics() -> None:
    model = randomize_batchnorm(_SqueezeExcite()).eval().double()
    x = torch.randn(1, 4, 5, 5, dtype=torch.float64)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    assert _record(result).rewrites == 4  # hardswish, hardsigmoid, mul, add
    assert_equivalent(model, result.module, x, rel=1e-12)


class _ReadAfter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        z = torch.sigmoid(y)
        return z * y  # y is read after sigmoid: sigmoid_ would change it


class _Broadcasts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.conv(x).mean((2, 3), keepdim=True)
        return self.conv(pooled + x)  # pooled is fresh but broadcasts; x is the caller's


class _ViewKept(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        flat = y.flatten(1)  # a view of y, returned: y's write would show in it
        return torch.sigmoid(y), flat


class _Returned(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return y, torch.sigmoid(y)


class _ReturnsSum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + x  # no prepacked op reads the sum: nothing to save


class _IntegerSigmoid(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x.long() * 2)


def test_cases_that_must_be_left_alone() -> None:
    x = torch.randn(1, 3, 4, 4)
    for model, kind, reason in (
        (_ReadAfter(), "aten::sigmoid", inplace.READ_ELSEWHERE),
        (_ViewKept(), "aten::sigmoid", inplace.READ_ELSEWHERE),
        (_Returned(), "aten::sigmoid", inplace.READ_ELSEWHERE),
        (_ReturnsSum(), "aten::add", inplace.NO_PACKED_READER),
        (_Broadcasts(), "aten::add", inplace.BROADCASTS),
    ):
        model.eval()
        result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
        assert kind in _kinds(result.module), type(model).__name__
        assert reason in _record(result).skips, (type(model).__name__, _record(result).skips)
        assert_equivalent(model, result.module, x)


def test_binary_op_without_example_inputs_is_left_alone() -> None:
    model = _SqueezeExcite().eval()
    result = fxmobile.optimize(torch.jit.script(model))
    kinds = _kinds(result.module)
    assert "aten::mul" in kinds and "aten::add" in kinds
    assert "aten::hardsigmoid_" in kinds  # unary on a prepacked conv's output: always float
    assert inplace.SHAPE_UNKNOWN in _record(result).skips


def test_integer_tensor_is_not_written() -> None:
    model = _IntegerSigmoid().eval()
    x = torch.randn(1, 3, 4, 4) * 5
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    assert "aten::sigmoid" in _kinds(result.module)  # sigmoid_ cannot write a long tensor
    assert inplace.NOT_FLOATING in _record(result).skips
    assert torch.equal(result.module(x), model(x))
