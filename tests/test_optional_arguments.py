"""An optional argument left at its default None is specialized away, and the report says so
(issue 24, cause 6).

``forward(x, scale=2.0, bias: Optional[Tensor] = None)`` given only ``x`` failed on every eager
route with ``PassError: fx pass 'remove_identity' failed: ShapeProp error``, and torch's
ShapeProp printed a raw traceback to stderr: torch.fx's placeholder for ``bias`` is never None,
so the trace recorded ``y + bias``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Optional

import pytest
import torch
from torch import fx, nn

import fxmobile

X = torch.randn(2, 4)


class OptionalBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(
        self,
        x: torch.Tensor,
        scale: float = 2.0,
        bias: Optional[torch.Tensor] = None,  # noqa: UP045  (TorchScript's spelling)
    ) -> torch.Tensor:
        y = self.linear(x) * scale
        if bias is not None:
            y = y + bias
        return y


class KeywordOnlyMask(nn.Module):
    """A keyword-only optional input whose None default takes another path."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, mask: Optional[torch.Tensor] = None) -> torch.Tensor:  # noqa: UP045
        if mask is None:
            mask = torch.ones_like(x)
        return self.linear(x * mask)


def _mobile(model: nn.Module, **options: Any) -> Callable[..., Any]:
    result = fxmobile.optimize(model, example_inputs=X, **options)
    assert any("bias left at its default None" in n for n in result.report.notes)
    return result.module


ENTRY_POINTS: dict[str, Callable[[nn.Module], Callable[..., Any]]] = {
    "optimize_fx": lambda m: fxmobile.optimize_fx(m, X).graph_module,
    "optimize_fx, check off": lambda m: fxmobile.optimize_fx(m, X, check="off").graph_module,
    "optimize": _mobile,
    "optimize, check off": lambda m: _mobile(m, check="off"),
    "optimize_for_mobile": lambda m: fxmobile.optimize_for_mobile(m, example_inputs=X),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_optional_tensor_left_at_none_is_specialized_away(
    entry: str, capfd: pytest.CaptureFixture[str]
) -> None:
    model = OptionalBias().eval()
    optimized = ENTRY_POINTS[entry](model)
    with torch.no_grad():
        assert torch.allclose(optimized(X), model(X), atol=1e-6)
    assert capfd.readouterr().err == "", "nothing is printed to stderr"


def test_the_report_names_what_was_specialized_and_how_to_keep_it() -> None:
    report = fxmobile.optimize_fx(OptionalBias().eval(), X).report
    (note,) = [n for n in report.notes if "default None" in n]
    assert note.startswith("bias left at its default None: specialized away")
    assert "pass them in example_inputs" in note or "pass it in example_inputs" in note
    gm = fxmobile.optimize_fx(OptionalBias().eval(), X).graph_module
    names = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
    assert names == ["x", "scale"], "the graph no longer takes bias"


def test_an_optional_tensor_given_in_the_example_inputs_stays_an_input() -> None:
    model = OptionalBias().eval()
    bias = torch.randn(4)
    gm = fxmobile.optimize_fx(model, (X, 3.0, bias)).graph_module
    with torch.no_grad():
        assert torch.allclose(gm(X, 3.0, bias), model(X, 3.0, bias), atol=1e-6)
    assert not any(
        "default None" in n for n in fxmobile.optimize_fx(model, (X, 3.0, bias)).report.notes
    )


def test_without_example_inputs_concrete_args_placeholder_keeps_it_an_input() -> None:
    model = OptionalBias().eval()
    plain = fxmobile.optimize_fx(model)
    assert any("concrete_args={name: torch.fx.PH}" in n for n in plain.report.notes)
    with torch.no_grad():
        assert torch.allclose(plain.graph_module(X), model(X), atol=1e-6)
    kept = fxmobile.optimize_fx(model, concrete_args={"bias": fx.PH}).graph_module
    bias = torch.randn(4)
    with torch.no_grad():
        assert torch.allclose(kept(X, 2.0, bias), model(X, bias=bias), atol=1e-6)


def test_keyword_only_optional_input_left_at_none(capfd: pytest.CaptureFixture[str]) -> None:
    model = KeywordOnlyMask().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either
        result = fxmobile.optimize(model, example_inputs=X)
    with torch.no_grad():
        assert torch.allclose(result.module(X), model(X), atol=1e-6)
    assert any("mask left at its default None" in n for n in result.report.notes)
    assert capfd.readouterr().err == ""
