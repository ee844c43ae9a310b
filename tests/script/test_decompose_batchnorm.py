"""decompose_batchnorm: a BatchNorm that could not fold becomes a per-channel multiply-add.

    batch_norm(x)  ->  x * s + t    s = gamma / sqrt(var + eps),  t = beta - mean * s

Counts of ``aten::batch_norm`` (gone) and of the ``mul`` / ``add`` (and ``view_as`` when the
rank is unknown) that replace it, numerics against a float64 eager reference with random
BatchNorm statistics for 2-D and 3-D inputs, and what is left alone: training mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.script.decompose_batchnorm import DecomposeBatchNorm
from fxmobile.script.graph_utils import op_histogram
from tests.helpers import assert_equivalent, randomize_batchnorm
from tests.script.common import CTX as NO_INPUTS
from tests.script.common import constant_tensor, frozen, kinds, with_inputs


def batchnorms(module: torch.jit.ScriptModule) -> int:
    return kinds(module)["aten::batch_norm"]


@pytest.mark.parametrize("shape", [(3, 4), (2, 4, 7)], ids=["2d", "3d"])
def test_a_batchnorm_of_unknown_rank_decomposes_into_a_form_right_for_every_rank(
    shape: tuple[int, ...],
) -> None:
    model = randomize_batchnorm(nn.Sequential(nn.ReLU(), nn.BatchNorm1d(4))).eval()
    result = DecomposeBatchNorm().call(frozen(model), NO_INPUTS)
    assert (result.rewrites, batchnorms(result.unit)) == (1, 0)
    hist = op_histogram(result.unit, ["forward"])
    assert hist["aten::mul"] == hist["aten::add"] == hist["aten::view_as"] == 1
    assert_equivalent(model, result.unit, torch.randn(shape))


def test_a_batchnorm_of_known_rank_decomposes_into_one_multiply_add() -> None:
    model = randomize_batchnorm(nn.Sequential(nn.ReLU(), nn.BatchNorm2d(4))).eval()
    x = torch.randn(2, 4, 5, 5)
    result = DecomposeBatchNorm().call(frozen(model), with_inputs(x))
    hist = op_histogram(result.unit, ["forward"])
    assert (hist["aten::mul"], hist["aten::add"], hist.get("aten::view_as", 0)) == (1, 1, 0)
    assert_equivalent(model, result.unit, x)


@pytest.mark.parametrize("inputs", [(), (torch.randn(2, 4, 5, 5),)], ids=["rank unknown", "known"])
def test_the_decomposition_computes_in_the_statistics_dtype(
    inputs: tuple[torch.Tensor, ...],
) -> None:
    # s and t are worked out in float64: left so, they would promote a float32 model to float64
    model = randomize_batchnorm(nn.Sequential(nn.ReLU(), nn.BatchNorm2d(4))).eval()
    ctx = with_inputs(*inputs) if inputs else NO_INPUTS
    result = DecomposeBatchNorm().call(frozen(model), ctx)
    mul = result.unit.graph.findNode("aten::mul")  # type: ignore[attr-defined]  # stub lacks it
    assert constant_tensor(mul.inputsAt(1)).dtype == torch.float32
    x = torch.randn(2, 4, 5, 5)
    assert result.unit(x).dtype == torch.float32
    assert_equivalent(model, result.unit, x)


class FunctionalTrainingBatchNorm(nn.Module):
    if TYPE_CHECKING:  # buffers, for mypy; TorchScript cannot read string annotations
        mean: torch.Tensor
        var: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(self.conv(x), self.mean, self.var, training=True)


def test_a_batchnorm_in_training_mode_is_left_alone() -> None:
    model = FunctionalTrainingBatchNorm().eval()
    module = frozen(model)
    reason = {"BN in training mode, or its training flag is not a constant": 1}
    assert DecomposeBatchNorm().call(module, NO_INPUTS).skips == reason
    assert batchnorms(module) == 1


class TrainingThenEval(FunctionalTrainingBatchNorm):
    """A BatchNorm left alone, then two to decompose."""

    def __init__(self) -> None:
        super().__init__()
        self.bn, self.bn2 = nn.BatchNorm2d(4), nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.batch_norm(self.conv(x), self.mean, self.var, training=True)
        return self.bn2(self.bn(y.relu()).relu())


def test_a_batchnorm_left_alone_does_not_stop_the_ones_after_it() -> None:
    model = randomize_batchnorm(TrainingThenEval()).eval()
    result = DecomposeBatchNorm().call(frozen(model), NO_INPUTS)
    assert result.rewrites == 2
    assert result.skips == {"BN in training mode, or its training flag is not a constant": 1}
    assert batchnorms(result.unit) == 1
