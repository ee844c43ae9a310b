"""Parametrizations are evaluated once, on fxmobile's copy, into plain parameters
(``fxmobile.capture.parametrize``); the layer then folds and prepacks like any other."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize

import fxmobile
from tests.helpers import assert_equivalent, count_modules, randomize_batchnorm

X = torch.randn(2, 3, 9, 9)


class Symmetric(nn.Module):
    """A custom parametrization: the weight's 3x3 spatial kernel made symmetric."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return (w + w.transpose(-1, -2)) / 2


PARAMETRIZE: dict[str, tuple[Callable[[nn.Conv2d], object], str]] = {
    "weight_norm": (lambda c: parametrizations.weight_norm(c), "_WeightNorm"),
    "old_weight_norm": (lambda c: torch.nn.utils.weight_norm(c), "weight_norm"),
    "spectral_norm": (lambda c: parametrizations.spectral_norm(c), "_SpectralNorm"),
    "old_spectral_norm": (lambda c: torch.nn.utils.spectral_norm(c), "spectral_norm"),
    "orthogonal": (lambda c: parametrizations.orthogonal(c), "_Orthogonal"),
    "custom": (
        lambda c: parametrize.register_parametrization(c, "weight", Symmetric()),
        "Symmetric",
    ),
}


def model_with(kind: str) -> nn.Sequential:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3) if kind != "orthogonal" else nn.Conv2d(3, 8, 1)
    register, _ = PARAMETRIZE[kind]
    register(conv)
    model = nn.Sequential(conv, nn.BatchNorm2d(8), nn.ReLU())
    with torch.no_grad():  # spectral norm's power iteration runs in training mode: once here
        model.train()(X)
    return randomize_batchnorm(model).eval()


@pytest.mark.parametrize("with_inputs", [True, False], ids=["inputs", "no_inputs"])
@pytest.mark.parametrize("kind", PARAMETRIZE)
def test_parametrization_is_baked_and_folded(kind: str, with_inputs: bool) -> None:
    model = model_with(kind)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = X if with_inputs else None
    fx_result = fxmobile.optimize_fx(model, inputs)
    assert fx_result.report.parametrizations == {PARAMETRIZE[kind][1]: 1}
    assert count_modules(fx_result.graph_module, nn.BatchNorm2d) == 0, "BN folded into the conv"
    assert_equivalent(model, fx_result.graph_module, X)
    mobile = fxmobile.optimize(model, example_inputs=inputs)
    assert mobile.report.parametrizations == {PARAMETRIZE[kind][1]: 1}
    assert_equivalent(model, mobile.module, X)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before), "the user's model changed"
    assert parametrize.is_parametrized(model[0]) or model[0]._forward_pre_hooks


def test_report_counts_parametrizations() -> None:
    text = str(fxmobile.optimize_fx(model_with("weight_norm"), X).report)
    assert "parametrizations evaluated into plain parameters: _WeightNorm 1" in text
