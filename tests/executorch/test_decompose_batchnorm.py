"""``decompose_batchnorm`` (export stage): a BatchNorm XNNPACK would not fuse, as ``x * s + t``."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx, nn

from fxmobile.executorch.passes.decompose_batchnorm import DecomposeBatchNorm, can_decompose
from tests.export_helpers import assert_same_nonfinite, aten, count, exported, run_pass
from tests.helpers import assert_equivalent, randomize_batchnorm

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")

NORM = aten._native_batch_norm_legit_no_training.default


class Shifted(nn.Module):
    """A BatchNorm after an addition: no conv to fuse it into."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + 1.0)


@pytest.mark.parametrize(
    ("norm", "shape"),
    [
        (nn.BatchNorm2d(4), (2, 4, 5, 6)),
        (nn.BatchNorm1d(4), (3, 4)),
        (nn.BatchNorm1d(4), (3, 4, 7)),
        (nn.BatchNorm2d(4, affine=False), (2, 4, 5, 6)),
        (nn.BatchNorm3d(4), (1, 4, 2, 3, 3)),
    ],
    ids=["2d", "1d-rows", "1d-sequence", "no-affine", "3d"],
)
def test_each_batch_norm_becomes_a_multiply_add_and_matches_float64(
    norm: nn.Module, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    model, x = randomize_batchnorm(Shifted(norm)).eval(), torch.randn(shape) * 3
    gm, record = run_pass(DecomposeBatchNorm(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, NORM) == 0
    assert (count(gm, aten.mul.Tensor), count(gm, aten.add.Tensor)) == (1, 2)
    assert_equivalent(model, gm, x)


def test_an_infinity_stays_an_infinity_in_the_program() -> None:
    """XNNPACK takes a BatchNorm without a conv as a 1x1 depthwise convolution, which turned
    an Inf into NaN of its neighbours (research note R7): this program failed before the pass."""
    from fxmobile.executorch.export import export_module
    from fxmobile.executorch.lower import lower
    from fxmobile.executorch.runtime import ProgramRunner

    torch.manual_seed(0)
    model = randomize_batchnorm(Shifted(nn.BatchNorm2d(3))).eval()
    x = torch.randn(1, 3, 5, 5)
    x[0, 1, 2, 2], x[0, 0, 1, 1] = float("inf"), float("nan")
    gm, _ = run_pass(DecomposeBatchNorm(), exported(model, x), x)
    program = export_module(gm, (x,), "rewritten")
    lowered = lower(program, "rewritten")
    assert (lowered.facts.delegate_calls, lowered.facts.portable_ops) == (1, ())
    with torch.no_grad():
        expected = model(x)
    got = ProgramRunner(lowered.buffer, program.call_spec.out_spec)(x)
    assert_same_nonfinite(expected, got, atol=1e-5)


class ConvNorm(nn.Module):
    def __init__(self, second_user: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.norm = nn.BatchNorm2d(4)
        self.second_user = second_user

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        out = self.norm(y)
        return out + y if self.second_user else out


def test_a_batch_norm_xnnpack_fuses_into_its_conv_is_left_to_it() -> None:
    model, x = randomize_batchnorm(ConvNorm()).eval(), torch.randn(1, 3, 6, 6)
    gm, record = run_pass(DecomposeBatchNorm(), exported(model, x), x)
    reason = "follows a conv or linear: XNNPACK fuses it into its weights"
    assert (record.rewrites, record.skips) == (0, {reason: 1})
    assert count(gm, NORM) == 1


def test_a_conv_with_another_user_is_not_fused_so_its_batch_norm_is_decomposed() -> None:
    model, x = randomize_batchnorm(ConvNorm(second_user=True)).eval(), torch.randn(1, 3, 6, 6)
    gm, record = run_pass(DecomposeBatchNorm(), exported(model, x), x)
    assert record.rewrites == 1
    assert_equivalent(model, gm, x)


def test_training_mode_and_saved_statistics_are_left_alone_with_the_reason() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2, 3, 4)
    stats = [graph.placeholder(name) for name in ("w", "b", "mean", "var")]
    training = graph.call_function(aten.native_batch_norm.default, (x, *stats, True, 0.1, 1e-5))
    frozen = graph.call_function(NORM, (x, *stats, 0.1, 1e-5))
    saved = graph.call_function(operator.getitem, (frozen, 1))
    graph.output((training, saved))
    gm = fx.GraphModule(nn.Module(), graph)
    assert can_decompose(gm, training) == "BN in training mode"
    assert can_decompose(gm, frozen) == "its saved statistics are read"
