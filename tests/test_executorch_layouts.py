"""The ExecuTorch target whatever the strides of the model's tensors and of the example inputs.

ExecuTorch reads a tensor's layout off its strides, where torch ignores the stride of a size-1
dim (``fxmobile.executorch.layout``). Each model here went wrong before the program was made of
tensors in the one contiguous layout: XNNPACK's delegate failed to run it, or it read
contiguous inputs as channels-last.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile.executorch.export import export_module
from fxmobile.executorch.layout import (
    canonical,
    contiguous_attributes,
    contiguous_inputs,
    contiguous_strides,
)
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")

WINDOWS = (4, 1, 49, 49)  # attention scores of 4 windows, one head, 7x7 tokens


def odd_strides(*shape: int) -> torch.Tensor:
    """Random values of ``shape`` whose size-1 dims have stride 1, as a permute leaves them:
    torch calls that contiguous, ExecuTorch another layout."""
    strides = [
        1 if size == 1 else s for size, s in zip(shape, contiguous_strides(shape), strict=True)
    ]
    tensor = torch.empty_strided(shape, strides).copy_(torch.randn(shape))
    assert tensor.is_contiguous() and tensor.stride() != contiguous_strides(tensor.shape)
    return tensor


class BiasBuffer(nn.Module):
    """Adds a bias held with odd strides: a model's own buffer."""

    bias: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("bias", odd_strides(1, 1, 49, 49))

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return (scores + self.bias).softmax(-1)


class FoldedBias(nn.Module):
    """Swin's relative-position bias with one head: a table permuted into (heads, N, N), whose
    unsqueeze fxmobile folds into a constant that keeps the permute's strides."""

    table: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("table", torch.randn(49, 49, 1))

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        bias = self.table.permute(2, 0, 1).contiguous()
        return (scores + bias.unsqueeze(0)).softmax(-1)


@pytest.mark.parametrize("model", [BiasBuffer, FoldedBias], ids=["buffer", "folded"])
def test_a_constant_with_odd_strides_makes_a_program_that_runs_and_matches(
    model: type[nn.Module],
) -> None:
    module, scores = model().eval(), torch.randn(*WINDOWS)
    result = fxmobile.optimize(module, example_inputs=scores, target_runtime="executorch")
    assert result.report.numerics_passed
    assert_equivalent(module, result.run, scores)


def test_an_example_input_with_odd_strides_makes_a_program_for_any_strides() -> None:
    module = nn.Softmax(-1).eval()
    scores = odd_strides(*WINDOWS)
    result = fxmobile.optimize(module, example_inputs=scores, target_runtime="executorch")
    for x in (scores, scores.clone(memory_format=torch.contiguous_format)):
        assert_equivalent(module, result.run, x)
    assert scores.stride() == (2401, 1, 49, 1)  # the caller's input is left as it was


def test_a_channels_last_example_input_makes_a_program_for_contiguous_inputs() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    result = fxmobile.optimize(module, example_inputs=x, target_runtime="executorch")
    assert result.report.numerics_passed
    for layout in (torch.contiguous_format, torch.channels_last):
        assert_equivalent(module, result.run, x.contiguous(memory_format=layout))
    assert x.is_contiguous(memory_format=torch.channels_last)


def test_the_callers_tensors_keep_their_strides() -> None:
    module = BiasBuffer().eval()
    bias = module.bias
    fxmobile.optimize(module, example_inputs=torch.randn(*WINDOWS), target_runtime="executorch")
    assert module.bias is bias and bias.stride() == (1, 1, 49, 1)


def test_canonical_copies_only_tensors_spelled_another_way() -> None:
    plain = torch.randn(2, 3)
    assert canonical(plain) is plain
    odd = odd_strides(1, 4, 5)
    fixed = canonical(odd)
    assert fixed.stride() == (20, 5, 1) and torch.equal(fixed, odd)
    channels_last = torch.randn(1, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    assert canonical(channels_last).stride() == (48, 16, 4, 1)
    x, n = contiguous_inputs(({"a": odd}, 3))
    assert x["a"].stride() == (20, 5, 1) and n == 3 and odd.stride() != (20, 5, 1)


def test_contiguous_attributes_replaces_tensors_and_keeps_ties_and_the_old_ones() -> None:
    first, second = nn.Linear(8, 4), nn.Linear(8, 4)
    first.weight = second.weight = nn.Parameter(torch.randn(8, 4).t())  # strides (1, 4)
    module = nn.Sequential(first, second)
    module.register_buffer("odd", odd_strides(1, 3, 2))
    old_weight = first.weight
    assert contiguous_attributes(module) == 2  # the tied weight once, the buffer
    assert first.weight is second.weight and isinstance(first.weight, nn.Parameter)
    assert first.weight.stride() == (8, 1) and torch.equal(first.weight, old_weight)
    assert old_weight.stride() == (1, 4)  # whoever else holds it sees it unchanged
    assert module.get_buffer("odd").stride() == (6, 2, 1)
    assert contiguous_attributes(module) == 0


def test_export_module_exports_the_model_as_it_is_for_executorchs_own_flow() -> None:
    """The zoo and the benchmark run ExecuTorch's own flow through ``export_module``: only
    fxmobile's flow gives the tensors the one spelling."""
    exported = export_module(BiasBuffer().eval(), (torch.randn(*WINDOWS),), "BiasBuffer")
    assert exported.state_dict["bias"].stride() == (1, 1, 49, 1)
