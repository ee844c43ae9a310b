"""``avg_pool_padding_as_pad``: an average pooling that counts its zero padding, as a constant
pad and a pooling without padding."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.executorch.passes.avg_pool_padding_as_pad import AvgPoolPaddingAsPad
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


class InceptionBranch(nn.Module):
    """Inception-v3's pool branch: a 3x3 average pool of stride 1 and padding 1, then a 1x1
    conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))


Fn = Callable[[torch.Tensor], torch.Tensor]

CASES: dict[str, tuple[Fn, tuple[int, ...]]] = {
    "3x3-stride-1": (lambda x: F.avg_pool2d(x, 3, 1, 1), (2, 4, 9, 7)),
    "3x3-stride-2": (nn.AvgPool2d(3, 2, 1), (1, 4, 10, 11)),
    "rectangular": (nn.AvgPool2d((3, 5), (1, 2), (1, 2)), (1, 3, 8, 9)),
    "default-stride": (lambda x: F.avg_pool2d(x, 2, padding=1), (1, 2, 7, 6)),
    "3-d-input": (lambda x: F.avg_pool2d(x, 3, 1, 1), (4, 6, 5)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_padded_pool_becomes_a_pad_and_a_pool_without_padding(case: str) -> None:
    fn, sizes = CASES[case]
    model = fn if isinstance(fn, nn.Module) else Apply(fn)
    torch.manual_seed(0)
    x = torch.randn(sizes)
    gm, record = run_pass(AvgPoolPaddingAsPad(), exported(model.eval(), x), x)
    assert record.rewrites == 1
    assert count(gm, aten.constant_pad_nd.default) == 1
    pools = [n for n in gm.graph.nodes if n.target is aten.avg_pool2d.default]
    assert len(pools) == 1 and list(pools[0].args[3]) == [0, 0]
    assert_equivalent(model, gm, x)


def test_nan_and_infinities_reach_the_outputs_eager_gives_them() -> None:
    model, x = Apply(lambda x: F.avg_pool2d(x, 3, 1, 1)).eval(), torch.randn(1, 2, 6, 6)
    x[0, 0, 0, 0], x[0, 0, 3, 3], x[0, 1, 5, 5], x[0, 1, 0, 5] = (
        float("nan"),
        float("inf"),
        float("-inf"),
        float("inf"),
    )
    gm, record = run_pass(AvgPoolPaddingAsPad(), exported(model, x), x)
    assert record.rewrites == 1
    with torch.no_grad():
        assert_same_nonfinite(model(x), gm(x))


@pytest.mark.parametrize(
    ("fn", "sizes", "reason"),
    [
        (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), (1, 2, 8, 8), "ceil_mode adds"),
        (lambda x: F.avg_pool2d(x, 2, 2, ceil_mode=True), (1, 2, 7, 6), "ceil_mode adds"),
        (lambda x: F.avg_pool2d(x, 3, 1, 1, divisor_override=4), (1, 2, 7, 7), "divisor_override"),
    ],
    ids=["ceil-mode-padded", "ceil-mode-odd-height", "divisor-override"],
)
def test_a_pool_whose_divisor_is_not_the_window_stays(
    fn: Fn, sizes: tuple[int, ...], reason: str
) -> None:
    model, x = Apply(fn).eval(), torch.randn(sizes)
    gm, record = run_pass(AvgPoolPaddingAsPad(), exported(model, x), x)
    assert record.rewrites == 0
    assert any(reason in why for why in record.skips)
    assert count(gm, aten.constant_pad_nd.default) == 0


class ResNetDShortcut(nn.Module):
    """ResNet-D's downsampling shortcut (timm resnet18d): a 2 x 2 average pool of stride 2 with
    ceil_mode and without counting padding, then a 1x1 conv."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False)
        self.conv = nn.Conv2d(4, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.pool(x))


CEIL_CASES: dict[str, tuple[Fn, tuple[int, ...]]] = {
    "resnet-d-even": (ResNetDShortcut(), (1, 4, 8, 6)),
    "padded-same-windows": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), (1, 2, 7, 9)),
    "stride-1": (lambda x: F.avg_pool2d(x, 3, 1, 0, ceil_mode=True), (1, 2, 6, 5)),
}


@pytest.mark.parametrize("case", list(CEIL_CASES))
def test_a_ceil_mode_that_adds_no_window_goes_and_the_program_is_whole(case: str) -> None:
    fn, sizes = CEIL_CASES[case]
    model = (fn if isinstance(fn, nn.Module) else Apply(fn)).eval()
    torch.manual_seed(0)
    x = torch.randn(sizes)
    before = program_of(exported(model, x), x)
    assert "aten.avg_pool2d" in {p.op for p in before.portable_ops}
    gm, record = run_pass(AvgPoolPaddingAsPad(), exported(model, x), x)
    assert record.rewrites == 1
    (pool,) = [n for n in gm.graph.nodes if n.target is aten.avg_pool2d.default]
    assert pool.args[4] is False
    assert_equivalent(model, gm, x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_pools_the_delegate_takes_already_are_not_touched() -> None:
    model = Apply(
        lambda x: (
            F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
            + F.avg_pool2d(x, 3, 1, 0)[..., 1:-1, 1:-1].sum()
        )
    ).eval()
    x = torch.randn(1, 2, 7, 7)
    gm, record = run_pass(AvgPoolPaddingAsPad(), exported(model, x), x)
    assert record.rewrites == 0 and not record.skips
    assert count(gm, aten.constant_pad_nd.default) == 0


def test_an_inception_pool_branch_is_one_delegate_call() -> None:
    torch.manual_seed(0)
    model, x = InceptionBranch().eval(), torch.randn(1, 4, 8, 8)
    before = program_of(exported(model, x), x)
    assert {p.op for p in before.portable_ops} == {"aten.avg_pool2d"}
    gm, _ = run_pass(AvgPoolPaddingAsPad(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())
    assert_equivalent(model, gm, x)
