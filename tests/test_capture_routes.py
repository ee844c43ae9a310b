"""The route that always finds a way: plain torch.fx, shape-aware torch.fx, automatic leaves,
then torch.jit.trace or torch.jit.script; each model idiom that stopped torch.fx, and what
happens to it now (``fxmobile.capture.tracing``, ``fxmobile.capture.shapes``)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxmobile
from fxmobile.errors import ScriptingError
from tests.helpers import assert_equivalent, count_modules, randomize_batchnorm

X = torch.randn(1, 3, 10, 10)


class ShapeArithmetic(nn.Module):
    """``int(x.shape[-2])``, ``math.ceil`` of a shape, and a branch on it (timm's Conv2dSame,
    smp's output-stride check)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = int(x.shape[-2]), math.ceil(x.shape[-1] / 2)
        y = self.bn(self.conv(x))
        if h % 4 != 0:
            y = F.pad(y, (0, 1))
        return y[..., :w]


class VarArgs(nn.Module):
    """``forward(x, *args, **kwargs)`` (ultralytics)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor, *args: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.conv(x) + sum(a.mean() for a in args)


class OptionalArguments(nn.Module):
    """Optional arguments defaulting to None that forward tests (transformers)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, return_dict: bool | None = None
    ) -> Any:
        y = self.conv(x)
        if mask is not None:
            y = y * mask
        return {"out": y} if return_dict else (y,)


class IteratedChunks(nn.Module):
    """``list(x.chunk(2, 1))``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.conv(x).chunk(2, 1))
        return torch.cat([p.relu() for p in parts], 1)


SHAPE_AWARE = {
    "shape_arithmetic": (ShapeArithmetic, (X,)),
    "var_args": (VarArgs, (X, torch.randn(2))),
    "iterated_chunks": (IteratedChunks, (X,)),
}


def test_optional_arguments_left_at_none_are_specialized_away_on_the_plain_route() -> None:
    model = randomize_batchnorm(OptionalArguments()).eval()
    for result in (fxmobile.optimize_fx(model, (X,)), fxmobile.optimize(model, example_inputs=X)):
        assert result.report.route == "torch.fx"
        assert any(
            n.startswith("mask, return_dict left at their default None: specialized away")
            for n in result.report.notes
        )
    assert_equivalent(model, fxmobile.optimize(model, example_inputs=X).module, X)


@pytest.mark.parametrize("idiom", SHAPE_AWARE)
def test_idiom_is_captured_shape_aware(idiom: str) -> None:
    cls, inputs = SHAPE_AWARE[idiom]
    model = randomize_batchnorm(cls()).eval()
    fx_result = fxmobile.optimize_fx(model, inputs)
    assert fx_result.report.route == "torch.fx (shape-aware)"
    assert fx_result.report.declined and fx_result.report.declined[0].startswith("plain tracing")
    assert_equivalent(model, fx_result.graph_module, *inputs)
    mobile = fxmobile.optimize(model, example_inputs=inputs)
    assert mobile.report.route == "torch.fx (shape-aware)"
    assert_equivalent(model, mobile.module, *inputs)


def test_shape_aware_capture_keeps_module_calls_foldable() -> None:
    model = randomize_batchnorm(ShapeArithmetic()).eval()
    result = fxmobile.optimize_fx(model, X)
    assert count_modules(result.graph_module, nn.BatchNorm2d) == 0
    assert result.report.record("fold_batchnorm").rewrites == 1


def test_specialized_model_refuses_another_shape() -> None:
    model = randomize_batchnorm(ShapeArithmetic()).eval()
    result = fxmobile.optimize(model, example_inputs=X)
    assert any("specialized to the example inputs' shapes" in n for n in result.report.notes)
    with pytest.raises(Exception, match="fxmobile specialized this model to input 'x'"):
        result.module(torch.randn(1, 3, 12, 12))


def test_plain_route_when_plain_tracing_works() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    result = fxmobile.optimize_fx(model, X)
    assert (result.report.route, result.report.declined) == ("torch.fx", [])
    result.graph_module(torch.randn(2, 3, 7, 7))  # not specialized


class Untraceable(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x - 1


class HasUntraceablePart(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.part = Untraceable()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part(self.conv(x))


def test_untraceable_submodule_becomes_a_leaf_by_default() -> None:
    model = HasUntraceablePart().eval()
    result = fxmobile.optimize_fx(model, X)
    assert any("kept as opaque leaves" in n and "part" in n for n in result.report.notes)
    assert_equivalent(model, result.graph_module, X)


def test_auto_leaf_false_restores_the_refusal() -> None:
    with pytest.raises(fxmobile.CaptureError, match="could not trace submodule 'part'"):
        fxmobile.optimize_fx(HasUntraceablePart().eval(), X, auto_leaf=False)


class CacheFilledInForward(nn.Module):
    """LeViT's attention_bias_cache: a dict filled on the first eval call."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bias = nn.Parameter(torch.randn(4, 1, 1))
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = str(x.device)
        if key not in self.cache:
            self.cache[key] = self.bias * 2
        return self.conv(x) + self.cache[key]


def test_cache_filled_in_forward_goes_through_the_traced_route() -> None:
    model = CacheFilledInForward().eval()
    result = fxmobile.optimize(model, example_inputs=X)
    assert result.report.route == "torch.jit.trace"
    assert result.report.declined[0].startswith("torch.fx: ")
    assert "changes the module's state" in result.report.declined[0]
    assert model.cache == {}, "the user's model was run"
    assert_equivalent(model, result.module, X)


class Counter(nn.Module):
    calls: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * self.calls


def test_state_that_changes_every_call_is_kept_and_starts_where_the_callers_does() -> None:
    model = Counter().eval()
    result = fxmobile.optimize(model, example_inputs=X)
    assert model.calls.item() == 0, "the caller's model was run"
    reference = copy.deepcopy(model)
    for _ in range(3):  # the same output call after call: 1x, 2x, 3x
        torch.testing.assert_close(result.module(X), reference(X))


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.mean() > 0:
            return y * 2
        return y - 1


class GrowingHistory(nn.Module):
    """Unscriptable (an unannotated empty list), and its output grows by a row every call."""

    def __init__(self) -> None:
        super().__init__()
        self.history: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.history.append(x.sum(0))
        return torch.stack(self.history)


def test_a_trace_whose_output_shape_the_next_call_changes_is_refused() -> None:
    """torch.jit.trace fixes the output to one row; the next eager call returns two. The replay
    check compares shapes too, so the trace is refused even with the check off."""
    model = GrowingHistory()
    with pytest.raises(ScriptingError, match="computes something else than forward"):
        fxmobile.optimize(model, example_inputs=X[0, 0], check="off")
    assert model.history == []


def test_data_dependent_control_flow_goes_through_torch_jit_script() -> None:
    model = DataDependent().eval()
    result = fxmobile.optimize(model, example_inputs=X)
    assert result.report.route == "torch.jit.script"
    for x in (X, -X * 10, X * 10):
        assert_equivalent(model, result.module, x)


def test_fallback_needs_example_inputs_or_a_scriptable_model() -> None:
    with pytest.raises(fxmobile.FxMobileError, match="pass example_inputs"):
        fxmobile.optimize(CacheFilledInForwardUnscriptable().eval())


class CacheFilledInForwardUnscriptable(CacheFilledInForward):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.setdefault("k", self.bias * 2)
        return self.conv(x) + self.cache["k"] + sum(t.sum() for t in [x])


def test_optimize_fx_has_no_fallback() -> None:
    with pytest.raises(fxmobile.CaptureError, match="changes the module's state"):
        fxmobile.optimize_fx(CacheFilledInForward().eval(), X)


# --- training mode, where it matters ----------------------------------------------------------


def test_parameter_free_module_in_training_mode_goes_through() -> None:
    model = nn.Sequential(nn.ReLU(), nn.Flatten())  # training mode, nothing depends on it
    result = fxmobile.optimize(model, example_inputs=X)
    assert_equivalent(model, result.module, X)


class DropPath(nn.Module):
    """timm's DropPath: forward reads self.training."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        return x * (torch.rand(x.shape[0], 1, 1, 1) > 0.5)


def test_module_reading_self_training_is_still_refused() -> None:
    with pytest.raises(fxmobile.TrainingModeError, match=r"1 submodules whose forward depends"):
        fxmobile.optimize(nn.Sequential(nn.Conv2d(3, 4, 3).eval(), DropPath()).train())


def test_quantized_model_left_in_training_mode_by_convert_goes_through() -> None:
    model = nn.Sequential(
        torch.ao.quantization.QuantStub(),
        nn.Conv2d(3, 4, 3),
        nn.ReLU(),
        torch.ao.quantization.DeQuantStub(),
    ).eval()
    model.qconfig = torch.ao.quantization.get_default_qconfig("qnnpack")
    prepared = torch.ao.quantization.prepare(model)
    prepared(X)
    with (
        torch.backends.quantized.engine_context("qnnpack")
        if hasattr(torch.backends.quantized, "engine_context")
        else _Engine("qnnpack")
    ):
        converted = torch.ao.quantization.convert(prepared).train()  # the recipe's state
        assert all(m.training for m in converted.modules())
        result = fxmobile.optimize(converted, example_inputs=X)
        assert result.report.numerics_passed


class _Engine:
    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.previous = torch.backends.quantized.engine
        torch.backends.quantized.engine = self.name

    def __exit__(self, *exc: object) -> None:
        torch.backends.quantized.engine = self.previous
