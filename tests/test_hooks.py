"""Module hooks: traced into the graph where that is provably safe, kept with their module
otherwise, never dropped (``fxmobile.capture.hooks``).

Each idiom is checked on every route (``optimize_fx``, ``optimize``, ``optimize_for_mobile``;
with and without example inputs) against a float64 eager anchor with the hooks registered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile.capture.hooks import KEPT, NO_EFFECT, TRACED, why_not_traceable
from fxmobile.errors import CaptureError
from tests.helpers import assert_equivalent, count_modules, randomize_batchnorm

X = torch.randn(2, 3, 10, 10)


def conv_bn_relu() -> nn.Sequential:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    return randomize_batchnorm(model).eval()


def _pre_double(m: nn.Module, args: tuple[Any, ...]) -> Any:
    return (args[0] * 2,)


def _plus_one(m: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
    return out + 1


def _times_three(m: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
    return out * 3


def _minus_kw(m: nn.Module, args: Any, kwargs: Any, out: torch.Tensor) -> torch.Tensor:
    return out - 1


def _pre_kw(m: nn.Module, args: Any, kwargs: Any) -> Any:
    return (args[0] + 0.5,), kwargs


def _in_place(m: nn.Module, args: Any, out: torch.Tensor) -> None:
    out.mul_(0.5)  # returns nothing: the write is the hook's effect


HOOKS: dict[str, Callable[[nn.Sequential], object]] = {
    "forward_pre_hook_on_batchnorm": lambda m: m[1].register_forward_pre_hook(_pre_double),
    "forward_hook_on_conv": lambda m: m[0].register_forward_hook(_plus_one),
    "forward_hook_on_batchnorm": lambda m: m[1].register_forward_hook(_times_three),
    "forward_hook_on_activation": lambda m: m[2].register_forward_hook(_plus_one),
    "kwargs_forward_hook_on_conv": lambda m: m[0].register_forward_hook(
        _minus_kw, with_kwargs=True
    ),
    "kwargs_pre_hook_on_conv": lambda m: m[0].register_forward_pre_hook(_pre_kw, with_kwargs=True),
    "in_place_forward_hook_on_conv": lambda m: m[0].register_forward_hook(_in_place),
    "lambda_forward_hook_on_conv": lambda m: m[0].register_forward_hook(lambda m, a, o: o * 2),
    "forward_hook_on_the_model": lambda m: m.register_forward_hook(_plus_one),
    "forward_pre_hook_on_the_model": lambda m: m.register_forward_pre_hook(_pre_double),
}

ROUTES: dict[str, Callable[[nn.Module, bool], Callable[..., Any]]] = {
    "optimize_fx": lambda m, x: fxmobile.optimize_fx(m, X if x else None).graph_module,
    "optimize": lambda m, x: fxmobile.optimize(m, example_inputs=X if x else None).module,
    "optimize_for_mobile": lambda m, x: fxmobile.optimize_for_mobile(
        m, example_inputs=X if x else None
    ),
}


@pytest.mark.parametrize("with_inputs", [True, False], ids=["inputs", "no_inputs"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("idiom", HOOKS)
def test_hook_is_honoured(idiom: str, route: str, with_inputs: bool) -> None:
    model = conv_bn_relu()
    HOOKS[idiom](model)
    optimized = ROUTES[route](model, with_inputs)
    assert_equivalent(model, optimized, X)


def test_traceable_hooks_are_folded_like_graph_code() -> None:
    """``conv -> hook(+1) -> BN`` ends as one conv: the hook's add is a graph node that the
    BatchNorm fold and the arithmetic fold take into the weights."""
    model = conv_bn_relu()
    model[0].register_forward_hook(_plus_one)
    model[1].register_forward_hook(_times_three)
    result = fxmobile.optimize_fx(model, X)
    gm = result.graph_module
    assert count_modules(gm, nn.BatchNorm2d) == 0
    assert not any(m._forward_hooks for m in gm.modules()), "the traced hooks must not run twice"
    assert [h.action for h in result.report.hooks] == [TRACED, TRACED]
    assert_equivalent(model, gm, X)


def test_the_users_model_keeps_its_hooks() -> None:
    model = conv_bn_relu()
    handle = model[0].register_forward_hook(_plus_one)
    fxmobile.optimize(model, example_inputs=X)
    assert list(model[0]._forward_hooks.values()) == [_plus_one]
    handle.remove()


class Recorder:
    """A hook with state: what a feature-extraction hook looks like."""

    def __init__(self) -> None:
        self.seen: list[torch.Size] = []

    def __call__(self, m: nn.Module, args: Any, out: torch.Tensor) -> None:
        self.seen.append(out.shape)


def test_recording_hook_keeps_its_module_call_and_runs_at_run_time() -> None:
    model = conv_bn_relu()
    recorder = Recorder()
    model[0].register_forward_hook(recorder)
    result = fxmobile.optimize_fx(model, X)
    gm = result.graph_module
    (record,) = result.report.hooks
    assert record.module == "0" and record.action.startswith(KEPT)
    assert "callable Recorder object" in record.action
    # the conv is still called (with its hook): the BN did not fold into it
    assert count_modules(gm, nn.Conv2d) == 1
    assert result.report.record("fold_batchnorm").skips == {
        "producer module: Conv2d has forward hooks": 1
    }
    recorder.seen.clear()
    with torch.no_grad():
        gm(X)
    assert recorder.seen == [torch.Size([2, 8, 8, 8])], "the hook runs when the module runs"
    assert_equivalent(model, gm, X)


def test_recording_hook_on_the_mobile_route_is_traced_with_example_inputs() -> None:
    """TorchScript cannot compile a callable object; with example inputs the module is traced,
    and the result still matches eager."""
    model = conv_bn_relu()
    model[0].register_forward_hook(Recorder())
    result = fxmobile.optimize(model, example_inputs=X)
    assert result.report.numerics_passed
    assert_equivalent(model, result.module, X)


def test_kept_hook_declines_channels_last() -> None:
    model = conv_bn_relu()
    model[2].register_forward_hook(Recorder())
    result = fxmobile.optimize_fx(model, X, channels_last=True)
    skips = result.report.record("to_channels_last").skips
    assert skips == {"a value it reaches goes through a hooked module (its hooks would see the "
                     "new layout)": 1}  # fmt: skip


def test_untraceable_hook_on_the_model_itself_is_refused() -> None:
    model = conv_bn_relu()
    model.register_forward_hook(Recorder())
    with pytest.raises(CaptureError, match=r"forward hook on itself \(Recorder\).*register it on"):
        fxmobile.optimize_fx(model, X)


def test_global_module_hooks_are_refused_naming_them() -> None:
    # torch's stub types the hook as returning None; a forward hook may return a new output
    handle = torch.nn.modules.module.register_module_forward_hook(_plus_one)  # type: ignore[arg-type]
    try:
        with pytest.raises(CaptureError, match=r"global module hooks are registered \(_plus_one\)"):
            fxmobile.optimize(conv_bn_relu(), example_inputs=X)
    finally:
        handle.remove()
    fxmobile.optimize(conv_bn_relu(), example_inputs=X)  # and gone once removed


def test_backward_hooks_have_no_effect_and_are_noted() -> None:
    model = conv_bn_relu()
    model[0].register_full_backward_hook(lambda m, gi, go: None)
    result = fxmobile.optimize_fx(model, X)
    assert [(h.module, h.action) for h in result.report.hooks] == [("0", NO_EFFECT)]
    assert count_modules(result.graph_module, nn.BatchNorm2d) == 0


def test_hooks_show_in_the_report_table() -> None:
    model = conv_bn_relu()
    model[0].register_forward_hook(_plus_one)
    text = str(fxmobile.optimize_fx(model, X).report)
    assert "hooked module" in text and "_plus_one" in text and TRACED in text


COUNTER = [0]


def _counts(m: nn.Module, args: Any, out: torch.Tensor) -> None:
    COUNTER[0] += 1


class Collects(nn.Module):
    """A module with a list of outputs, for a hook to append to."""

    seen: list[torch.Tensor]


def _appends(m: Collects, args: Any, out: torch.Tensor) -> None:
    m.seen.append(out)


def _sets_attribute(m: nn.Module, args: Any, out: torch.Tensor) -> None:
    m.last = out


def _prints(m: nn.Module, args: Any, out: torch.Tensor) -> None:
    print(out.shape)


SCALE = torch.tensor(2.0)


def _scales_a_global_in_place(m: nn.Module, args: Any, out: torch.Tensor) -> None:
    SCALE.mul_(2)


@pytest.mark.parametrize(
    "hook,reason",
    [
        (_counts, "global 'COUNTER': a list object"),
        (_appends, "calls .append()"),
        (_sets_attribute, "writes outside its locals (STORE_ATTR last)"),
        (_prints, "calls the builtin print()"),
        (_scales_a_global_in_place, "a tensor, and the hook calls an in-place method"),
        (Recorder(), "callable Recorder object"),
        (Recorder().__call__, "bound method"),
    ],
    ids=["global_counter", "append", "attribute", "print", "global_tensor", "object", "method"],
)
def test_hooks_with_effects_are_not_traced(hook: Callable[..., Any], reason: str) -> None:
    found = why_not_traceable(hook)
    assert found is not None and reason in found


@pytest.mark.parametrize("hook", [_plus_one, _minus_kw, _pre_double, _in_place, _times_three])
def test_pure_hooks_are_traceable(hook: Callable[..., Any]) -> None:
    assert why_not_traceable(hook) is None
