"""``decompose_variance``: a variance as the mean of squared deviations, scaled, whose means and
sums ``decompose_mean`` then makes matmuls, so XNNPACK takes what ExecuTorch leaves on portable
kernels."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from fxmobile.executorch.passes.decompose_mean import DecomposeMean
from fxmobile.executorch.passes.decompose_variance import DecomposeVariance
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

Fn = Callable[[torch.Tensor], torch.Tensor]


def evonorm_group_std(x: torch.Tensor) -> torch.Tensor:
    """timm's EvoNorm-S0: the standard deviation of each group of channels, kept for a divide."""
    b, c, h, w = x.shape
    groups = x.reshape(b, 2, c // 2, h, w)
    std = (groups.var(dim=(2, 3, 4), unbiased=False, keepdim=True) + 1e-5).sqrt()
    return (groups / std).reshape(b, c, h, w)


# (the variance, the input's shape)
CASES: dict[str, tuple[Fn, tuple[int, ...]]] = {
    "channels-unbiased": (lambda x: x.var(dim=1, keepdim=True), (2, 6, 4, 5)),
    "evonorm-groups": (evonorm_group_std, (1, 8, 5, 6)),
    "last-dim-correction-0": (lambda x: torch.var(x, -1, correction=0), (3, 7)),
    "all-elements": (lambda x: x.var(), (4, 5)),
    "std": (lambda x: x.std(dim=(1, 2)), (2, 3, 4)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_variance_becomes_a_mean_of_squares_and_matches_float64(name: str) -> None:
    f, shape = CASES[name]
    torch.manual_seed(0)
    model, x = Apply(f).eval(), torch.randn(shape) * 3 + 2
    gm, record = run_pass(DecomposeVariance(), exported(model, x), x)
    assert record.rewrites == 1 and record.skips == {}
    variances = (aten.var.dim, aten.var.correction, aten.var.default, aten.std.dim)
    assert sum(count(gm, v) for v in (*variances, aten.std.correction)) == 0
    assert count(gm, aten.mean.dim) == 1 and count(gm, aten.sum.dim_IntList) == 1
    assert_equivalent(model, gm, x)


@pytest.mark.parametrize("name", list(CASES))
def test_a_nan_or_infinity_spoils_the_lines_it_spoils_in_eager(name: str) -> None:
    f, shape = CASES[name]
    torch.manual_seed(0)
    model, x = Apply(f).eval(), torch.randn(shape)
    flat = x.view(-1)
    flat[0], flat[-1] = float("nan"), float("inf")
    gm, _ = run_pass(DecomposeVariance(), exported(model, x), x)
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert not expected.isfinite().all()
    assert_same_nonfinite(expected, got, atol=1e-5)


class RmsConvBlock(nn.Module):
    """A conv, then a variance over its channels, as timm's EvoNorm and RMS-normalized ConvNeXt
    blocks compute one."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y / (y.var(dim=1, keepdim=True) + 1e-6).sqrt()


def test_own_flow_leaves_the_variance_on_portable_kernels_and_this_does_not() -> None:
    torch.manual_seed(0)
    model, x = RmsConvBlock().eval(), torch.randn(1, 3, 8, 8)
    before = program_of(exported(model, x), x)
    assert "aten.var.correction" in {p.op for p in before.portable_ops}
    gm, _ = run_pass(DecomposeVariance(), exported(model, x), x)
    gm, _ = run_pass(DecomposeMean(), gm, x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())
    assert_equivalent(model, gm, x)


@pytest.mark.parametrize(
    ("f", "shape", "reason"),
    [
        (lambda x: x.var(dim=1, correction=3), (2, 3, 4), "eager divides by zero or less"),
        (lambda x: x.double().var(dim=1), (2, 3, 4), "torch.float64 input"),
    ],
    ids=["correction-as-large-as-n", "float64"],
)
def test_what_it_cannot_match_is_left_alone_with_the_reason(
    f: Fn, shape: tuple[int, ...], reason: str
) -> None:
    model, x = Apply(f).eval(), torch.randn(shape)
    gm, record = run_pass(DecomposeVariance(), exported(model, x), x)
    assert record.rewrites == 0
    assert any(reason in why for why in record.skips), record.skips
    assert count(gm, aten.var.correction) + count(gm, aten.var.dim) == 1
