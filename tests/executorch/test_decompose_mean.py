"""``decompose_mean``: means, sums, adaptive average pools and average pools of one whole-input
window as ``mean.dim`` over [2, 3] kept, or as matmuls by constant weights."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxmobile
from fxmobile.executorch.passes.decompose_mean import MAX_WEIGHTS, DecomposeMean, can_decompose
from tests.export_helpers import (
    Apply,
    assert_same_nonfinite,
    aten,
    count,
    exported,
    program_of,
    run_pass,
)
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


class Head(nn.Module):
    """EfficientFormer's and LeViT's head in small: the mean over tokens, then a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(1))


# (the reduction, input shape, linears, bmms, mean.dims it becomes)
CASES = {
    "spatial": (lambda x: x.mean((2, 3)), (2, 8, 5, 4), 0, 0, 1),
    "spatial-negative": (lambda x: x.mean((-1, -2)), (2, 8, 5, 4), 0, 0, 1),
    "last": (lambda x: x.mean(-1), (2, 7, 16), 1, 0, 0),
    "last-kept": (lambda x: x.mean(-1, keepdim=True), (2, 7, 16), 1, 0, 0),
    "last-two": (lambda x: x.mean((1, 2)), (3, 7, 16), 1, 0, 0),
    "tokens": (lambda x: x.mean(1), (2, 7, 16), 0, 1, 0),
    "channels": (lambda x: x.mean(1, keepdim=True), (2, 8, 5, 4), 0, 1, 0),
    "apart": (lambda x: x.mean((1, 3)), (2, 3, 5, 4), 1, 1, 0),
    "sum-last": (lambda x: x.sum(-1, keepdim=True), (2, 7, 16), 1, 0, 0),
    "sum-spatial": (lambda x: x.sum((2, 3)), (2, 8, 5, 4), 0, 0, 1),
    "sum-all": (lambda x: x.sum(), (4, 5), 1, 0, 0),
    "pool-permuted": (
        lambda x: F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1),
        (2, 5, 4, 8),
        0,
        0,
        1,
    ),
    "pool-2x3": (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), (1, 4, 6, 9), 1, 1, 0),
    "avg-pool-whole": (lambda x: F.avg_pool2d(x, (5, 4)), (2, 8, 5, 4), 0, 0, 1),
    # Hugging Face's EfficientNet head: a kernel past the 7 x 7 input, ceil_mode
    "avg-pool-ceil": (lambda x: F.avg_pool2d(x, 1280, ceil_mode=True), (1, 8, 7, 7), 0, 0, 1),
    # Hugging Face's Swin head: AdaptiveAvgPool1d(1) of the transposed tokens
    "pool1d-tokens": (lambda x: F.adaptive_avg_pool1d(x.transpose(1, 2), 1), (2, 7, 16), 1, 0, 0),
    "pool1d-2": (lambda x: F.adaptive_avg_pool1d(x, 2), (2, 3, 8), 1, 0, 0),
    "pool1d-unbatched": (lambda x: F.adaptive_avg_pool1d(x, 1), (3, 8), 1, 0, 0),
}


@pytest.mark.parametrize(("name"), list(CASES))
def test_each_reduction_becomes_ops_xnnpack_takes_and_matches_float64(name: str) -> None:
    f, shape, linears, bmms, means = CASES[name]
    torch.manual_seed(0)
    model, x = Apply(f).eval(), torch.randn(shape) * 2 + 1
    gm, record = run_pass(DecomposeMean(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.sum.dim_IntList) == 0
    assert count(gm, aten.adaptive_avg_pool2d.default) == 0
    assert count(gm, aten.adaptive_avg_pool1d.default) == 0
    assert count(gm, aten.avg_pool2d.default) == 0
    assert count(gm, aten.linear.default) == linears
    assert count(gm, aten.bmm.default) == bmms
    assert count(gm, aten.mean.dim) == means
    means_left = [n for n in gm.graph.nodes if n.target is aten.mean.dim]
    assert all(n.args[1:] == ([2, 3], True) for n in means_left)  # the global pool form
    assert_equivalent(model, gm, x)


@pytest.mark.parametrize(
    "name",
    [
        "spatial",
        "last",
        "tokens",
        "apart",
        "pool-2x3",
        "avg-pool-whole",
        "avg-pool-ceil",
        "pool1d-tokens",
    ],
)
def test_a_nan_or_infinity_reaches_the_outputs_it_reaches_in_eager(name: str) -> None:
    f, shape, *_ = CASES[name]
    torch.manual_seed(0)
    model, x = Apply(f).eval(), torch.randn(shape)
    flat = x.view(-1)
    flat[0], flat[7], flat[-1], flat[-3] = float("nan"), float("inf"), float("-inf"), float("inf")
    gm, _ = run_pass(DecomposeMean(), exported(model, x), x)
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert not expected.isfinite().all()
    assert_same_nonfinite(expected, got, atol=1e-5)


def test_own_flow_leaves_a_whole_input_ceil_mode_pool_outside_and_this_leaves_none() -> None:
    """Hugging Face's EfficientNet head: its program had one op on portable kernels, this
    pool, at about 7.5 s a call."""
    model = Apply(lambda x: F.avg_pool2d(x, 1280, ceil_mode=True)).eval()
    x = torch.randn(1, 8, 7, 7)
    before = program_of(exported(model, x), x)
    assert [p.op for p in before.portable_ops] == ["aten.avg_pool2d"]
    gm, _ = run_pass(DecomposeMean(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_own_flow_leaves_the_token_mean_outside_and_this_leaves_none() -> None:
    torch.manual_seed(0)
    model, x = Head().eval(), torch.randn(2, 7, 8)
    before = program_of(exported(model, x), x)
    assert [p.op for p in before.portable_ops] == ["aten.mean.dim"]
    gm, _ = run_pass(DecomposeMean(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_own_flow_leaves_hugging_face_swins_token_pool_outside_and_this_leaves_none() -> None:
    model = Apply(lambda x: F.adaptive_avg_pool1d(x.transpose(1, 2), 1).flatten(1)).eval()
    x = torch.randn(1, 49, 16)
    before = program_of(exported(model, x), x)
    assert before.portable_ops
    gm, _ = run_pass(DecomposeMean(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


@pytest.mark.parametrize(
    "f",
    [
        lambda x: x.mean((2, 3), keepdim=True),
        lambda x: F.adaptive_avg_pool2d(x, 1),
        lambda x: F.avg_pool2d(x, 2),
        lambda x: F.avg_pool2d(x, (4, 4)),
        lambda x: F.avg_pool2d(x, (5, 4), padding=(1, 0), ceil_mode=True),
    ],
    ids=["kept-spatial-mean", "contiguous-pool", "pool-of-windows", "window-short", "padded"],
)
def test_the_global_pool_xnnpack_takes_is_no_candidate(
    f: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """A 4-D mean over [2, 3] kept XNNPACK takes; a 1 x 1 adaptive pool of a contiguous tensor
    in a graph without layout copies ExecuTorch makes that mean (rewriting it would cost an
    export again, for nothing). An average pool of several windows, of one window shorter than
    the input, or of a padded one is no mean."""
    model, x = Apply(f).eval(), torch.randn(2, 8, 5, 4)
    gm, record = run_pass(DecomposeMean(), exported(model, x), x)
    assert (record.rewrites, dict(record.skips)) == (0, {})
    pools = (aten.mean.dim, aten.adaptive_avg_pool2d.default, aten.avg_pool2d.default)
    assert sum(count(gm, op) for op in pools) == 1


@pytest.mark.parametrize(
    ("f", "x", "reason"),
    [
        (
            lambda x: x.mean(-1),
            torch.randn(2, 8, dtype=torch.float64),
            "torch.float64 input: the XNNPACK delegate computes float32",
        ),
        (lambda x: x.sum(-1, dtype=torch.float64), torch.randn(2, 8), "a dtype= argument"),
        (lambda x: x.mean(-1), torch.randn(2, 0), "an empty input"),
        (
            lambda x: F.adaptive_avg_pool2d(x, (2, 2)),
            torch.randn(1, 2, 5, 4),
            "5x4 -> 2x2: the output does not divide the input",
        ),
        (
            lambda x: F.adaptive_avg_pool1d(x, 3),
            torch.randn(1, 2, 8),
            "8 -> 3: the output does not divide the input",
        ),
        (
            lambda x: x.mean(1),
            torch.randn(MAX_WEIGHTS + 1, 1, 2),
            f"a bmm weight of {MAX_WEIGHTS + 1} elements (over {MAX_WEIGHTS})",
        ),
        (
            lambda x: F.avg_pool2d(x, (5, 4), divisor_override=3),
            torch.randn(1, 2, 5, 4),
            "a divisor_override: not the mean",
        ),
    ],
    ids=[
        "float64",
        "dtype",
        "empty",
        "not-dividing",
        "not-dividing-1d",
        "large-weight",
        "divisor-override",
    ],
)
def test_what_it_cannot_rewrite_is_left_alone_with_the_reason(
    f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, reason: str
) -> None:
    _, record = run_pass(DecomposeMean(), exported(Apply(f), x), x)
    assert record.rewrites == 0
    assert record.skips == {reason: 1}


def test_without_shapes_it_declines() -> None:
    model, x = Apply(lambda x: x.mean(1)).eval(), torch.randn(2, 7, 16)
    gm = exported(model, x)
    for node in gm.graph.nodes:  # as if nothing had run: no recorded shapes
        node.meta.pop("val", None)
        node.meta.pop("tensor_meta", None)
    mean = next(n for n in gm.graph.nodes if n.target is aten.mean.dim)
    assert can_decompose(mean) == "input shape unknown (pass example_inputs)"


class HybridHead(nn.Module):
    """MobileNetV4's hybrid head in small: tokens mixed by a linear, transposed back into a
    feature map (the copy ``remove_layout_copies`` drops), a conv, a 1 x 1 adaptive pool of
    its output and a conv head."""

    def __init__(self) -> None:
        super().__init__()
        self.mix, self.conv, self.head = nn.Linear(8, 8), nn.Conv2d(8, 8, 1), nn.Conv2d(8, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = self.mix(x.flatten(2).transpose(1, 2))
        y = tokens.transpose(1, 2).reshape(b, c, h, w).contiguous()
        return self.head(F.adaptive_avg_pool2d(self.conv(y).relu(), 1)).flatten(1)


def test_a_pool_of_a_contiguous_tensor_is_a_global_pool_when_layout_copies_may_go() -> None:
    """Recorded contiguous, the pool's input is permuted at the last export once the copy
    before the conv is gone, and ExecuTorch made the pool an ``as_strided_copy`` on a portable
    kernel (mobilenetv4_hybrid_medium: 2 delegate calls and that op)."""
    torch.manual_seed(0)
    model, x = HybridHead().eval(), torch.randn(1, 8, 4, 4)
    result = fxmobile.optimize(model, example_inputs=(x,), target_runtime="executorch")
    program = result.report.program
    assert program is not None
    assert (program.delegate_calls, program.portable_ops) == (1, ())
    assert_equivalent(model, result.run, x)
