"""The TorchScript-level channels-last pass (fxmobile/script/make_inputs_channels_last.py):
ScriptModule input gets the eager route's layout; what it must leave alone, it leaves, with the
reason."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import fxmobile
from fxmobile import MobileOptimizerType
from fxmobile.report.records import PassRecord, Status
from fxmobile.script import make_inputs_channels_last as cl
from fxmobile.script.graph_utils import iter_nodes
from tests.helpers import assert_equivalent, randomize_batchnorm


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn(self.conv1(x)))
        z = self.conv2(y) + y
        return z, self.fc(z.mean((2, 3)))


def _formats(module: torch.jit.ScriptModule) -> list[int]:
    """The memory_format argument of every contiguous in forward."""
    nodes = [n for n in iter_nodes(module.graph) if n.kind() == "aten::contiguous"]
    formats: list[Any] = [n.inputsAt(1).toIValue() for n in nodes]  # torch's stubs: IValue
    return [int(f) for f in formats]


def _record(result: fxmobile.MobileResult) -> PassRecord:
    return next(p for p in result.report.passes if p.name == "make_inputs_channels_last")


def _optimized(model: nn.Module, x: torch.Tensor, **kw: Any) -> fxmobile.MobileResult:
    return fxmobile.optimize(torch.jit.script(model), example_inputs=x, **kw)


def test_script_module_runs_channels_last_and_returns_eager_layout() -> None:
    model = randomize_batchnorm(_Net()).eval()
    x = torch.randn(2, 3, 12, 10)
    result = _optimized(model, x)
    assert _record(result).rewrites == 1
    # the input; both outputs (free for the logits, already contiguous)
    assert _formats(result.module) == [cl.CHANNELS_LAST, cl.CONTIGUOUS, cl.CONTIGUOUS]
    assert_equivalent(model, result.module, x)
    z, _ = result.module(x)
    assert z.is_contiguous()  # eager's layout handed back
    assert x.is_contiguous()  # the caller's tensor is untouched


def test_float64_model_keeps_float64_numerics() -> None:
    model = randomize_batchnorm(_Net()).eval().double()
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    result = _optimized(model, x)
    assert _record(result).rewrites == 1
    assert_equivalent(model, result.module, x, rel=1e-12)


def test_eager_route_is_not_converted_twice() -> None:
    model = randomize_batchnorm(_Net()).eval()
    x = torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(model, example_inputs=x)
    assert _formats(result.module).count(cl.CHANNELS_LAST) == 1
    script = _record(result)
    assert script.rewrites == 0 and dict(script.skips) == {cl.FX_ROUTE: 1}


def test_without_example_inputs_it_says_why() -> None:
    model = _Net().eval()
    result = fxmobile.optimize(torch.jit.script(model))
    assert _record(result).rewrites == 0
    assert dict(_record(result).skips) == {cl.NO_INPUTS: 1}
    assert cl.CHANNELS_LAST not in _formats(result.module)


def test_eager_route_with_channels_last_off_keeps_eager_layout() -> None:
    model = _Net().eval()
    result = fxmobile.optimize(model, example_inputs=torch.randn(1, 3, 8, 8), channels_last=False)
    assert cl.CHANNELS_LAST not in _formats(result.module)


def test_input_already_channels_last_is_not_converted_again() -> None:
    class Converts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x.contiguous(memory_format=torch.channels_last)).contiguous()

    result = _optimized(Converts().eval(), torch.randn(1, 3, 8, 8))
    assert dict(_record(result).skips) == {cl.ALREADY: 1}
    assert _formats(result.module) == [cl.CHANNELS_LAST, cl.CONTIGUOUS]


def test_blocklist_switches_it_off() -> None:
    model = _Net().eval()
    x = torch.randn(1, 3, 8, 8)
    result = _optimized(model, x, optimization_blocklist={MobileOptimizerType.CHANNELS_LAST})
    assert cl.CHANNELS_LAST not in _formats(result.module)


class _WritesThroughView(nn.Module):
    """relu_ through a view of the conv output: a copy, not a view, once channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y.view(-1).clamp_(max=0.1)
        return y


class _ReadsStrides(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.is_contiguous():
            return y + 1
        return y - 1


class _WritesInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        x.mul_(2)
        return y


class _ReturnsAList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> list[list[torch.Tensor]]:
        return [[self.conv(x)]]


def test_cases_that_must_be_left_alone() -> None:
    x = torch.randn(1, 3, 8, 8)
    for model, reason in (
        (_WritesThroughView(), "aten::view of a tensor written in place"),
        (_ReadsStrides(), "aten::is_contiguous, which reads strides"),
        (_WritesInput(), cl.INPUT_WRITTEN),
        (_ReturnsAList(), "container"),
    ):
        model.eval()
        result = _optimized(model, x.clone())
        record = _record(result)
        assert record.rewrites == 0, type(model).__name__
        assert any(reason in r for r in record.skips), (type(model).__name__, record.skips)
        assert cl.CHANNELS_LAST not in _formats(result.module)
        if not isinstance(model, _WritesInput):
            assert_equivalent(model, result.module, x)


def test_a_view_that_needs_nchw_memory_undoes_the_change() -> None:
    class Flattens(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x).view(1, -1)

    model = Flattens().eval()
    x = torch.randn(1, 3, 8, 8)
    result = _optimized(model, x)
    assert dict(_record(result).skips) == {cl.CHANGED: 1}
    assert cl.CHANNELS_LAST not in _formats(result.module)
    assert_equivalent(model, result.module, x)


def test_channels_last_false_keeps_a_script_module_nchw() -> None:
    # the option reached only the FX stage: a ScriptModule was converted anyway
    model = randomize_batchnorm(_Net()).eval()
    x = torch.randn(1, 3, 16, 16)
    result = _optimized(model, x, channels_last=False)
    assert _record(result).status is Status.BLOCKLISTED
    assert _formats(result.module) == []
    assert_equivalent(model, result.module, x)
