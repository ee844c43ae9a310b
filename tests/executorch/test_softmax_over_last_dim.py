"""``softmax_over_last_dim``: a softmax over another dim, moved to the last between permutes,
and one the delegate would hold channels-last, over the rows of a reshape."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import fx, nn

from fxmobile.executorch.passes.softmax_over_last_dim import SoftmaxOverLastDim, softmax
from tests.export_helpers import (
    Apply,
    assert_same_nonfinite,
    aten,
    count,
    exported,
    program_of,
    program_outputs,
    run_pass,
)
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


def dfl(x: torch.Tensor) -> torch.Tensor:
    """YOLOv8's distribution focal loss head: a softmax over dim 1 of [b, c, 4, a]."""
    b, _, a = x.shape
    return x.view(b, 4, 16, a).transpose(2, 1).softmax(1)


CASES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[int, ...]]] = {
    "channels": (lambda x: x.softmax(1), (2, 5, 3, 4)),
    "first": (lambda x: torch.softmax(x, 0), (6, 5)),
    "negative": (lambda x: x.softmax(-2), (2, 7, 3)),
    "dtype": (lambda x: torch.softmax(x, 1, dtype=torch.float64), (2, 5, 3)),
    "yolo-dfl": (dfl, (1, 64, 10)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_softmax_moves_to_the_last_dim_and_matches_float64(case: str) -> None:
    fn, shape = CASES[case]
    torch.manual_seed(0)
    model, x = Apply(fn).eval(), torch.randn(shape) * 4
    gm, record = run_pass(SoftmaxOverLastDim(), exported(model, x), x)
    assert record.rewrites == 1
    softmax = next(n for n in gm.graph.nodes if n.target is aten.softmax.int)
    assert softmax.args[1] == -1
    assert softmax.args[2:] == (() if case != "dtype" else (torch.float64,))
    assert count(gm, aten.permute.default) >= 2
    assert_equivalent(model, gm, x)


def test_a_nan_or_infinity_spoils_its_own_line_as_in_eager() -> None:
    torch.manual_seed(0)
    model, x = Apply(lambda x: x.softmax(1)).eval(), torch.randn(2, 5, 3, 4)
    x[0, 1, 2, 3], x[1, 0, 0, 0], x[1, 4, 1, 2] = float("nan"), float("inf"), float("-inf")
    gm, _ = run_pass(SoftmaxOverLastDim(), exported(model, x), x)
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert_same_nonfinite(expected, got, atol=1e-6)


def test_the_private_softmax_moves_too_and_the_last_dim_is_no_candidate() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    inner = graph.call_function(aten._softmax.default, (x, 1, False))
    last = graph.call_function(aten._softmax.default, (inner, 2, False))
    graph.output(last)
    gm, t = fx.GraphModule(nn.Module(), graph), torch.randn(2, 3, 4)
    gm, record = run_pass(SoftmaxOverLastDim(), gm, t)
    assert record.rewrites == 1
    assert torch.allclose(gm(t), t.softmax(1).softmax(2))
    assert softmax(last, set()) is None  # over the last dim already, of a row-major tensor


def test_yolo_dfl_lowers_to_one_delegate_call_without_portable_ops() -> None:
    model, x = Apply(lambda x: dfl(x) * 2.0).eval(), torch.randn(1, 64, 10)
    before = program_of(exported(model, x), x)
    assert [p.op for p in before.portable_ops] == ["aten._softmax"]
    gm, _ = run_pass(SoftmaxOverLastDim(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


class ConvSoftmax(nn.Module):
    """A 1x1 conv, then a softmax of (a part of) its output: MobileViT-v2's linear attention
    splits its query off a conv's channels and normalizes it over the pixels of a row."""

    def __init__(self, then: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.conv, self.then = nn.Conv2d(8, 5, 1), then

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.then(self.conv(x))


AFTER_A_CONV: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "last-dim": lambda y: y.softmax(-1),
    "query-slice": lambda y: y[:, :1].softmax(-1) * 3.0,
    "after-relu": lambda y: (y.relu() + 1.0).softmax(3),
    "channels": lambda y: y.softmax(1),
    "same-shape-reshape": lambda y: y.reshape(y.shape).softmax(-1),
}


@pytest.mark.parametrize("case", list(AFTER_A_CONV))
def test_a_softmax_after_a_conv_runs_over_rows_and_its_program_matches(case: str) -> None:
    torch.manual_seed(0)
    model, x = ConvSoftmax(AFTER_A_CONV[case]).eval(), torch.randn(1, 8, 4, 6) * 3
    gm, record = run_pass(SoftmaxOverLastDim(), exported(model, x), x)
    assert record.rewrites == 1
    rows = next(n for n in gm.graph.nodes if n.target is aten.softmax.int).args[0]
    assert rows.target is aten.reshape.default and len(rows.args[1]) == 2
    assert_equivalent(model, gm, x)
    with torch.no_grad():
        expected = model(x)
    assert torch.allclose(program_outputs(gm, x), expected, atol=1e-6)
    assert program_of(gm, x).portable_ops == ()


def test_executorch_sums_channels_for_a_softmax_over_rows_after_a_conv() -> None:
    """The ExecuTorch 1.5.1 bug the rows rewrite steps around: its delegate holds the conv's
    output channels-last and its softmax normalizes the memory's last dim, the channels."""
    torch.manual_seed(0)
    model, x = ConvSoftmax(lambda y: y[:, :1].softmax(-1)).eval(), torch.randn(1, 8, 4, 6)
    assert torch.equal(program_outputs(exported(model, x), x), torch.ones(1, 1, 4, 6))


LEFT_ALONE: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[int, ...]]] = {
    "input-itself": (lambda x: x.softmax(-1), (1, 8, 4, 6)),
    "elementwise-on-input": (lambda x: (x * 2.0).sigmoid().softmax(-1), (1, 8, 4, 6)),
    "conv-reshaped": (
        lambda x: nn.functional.conv2d(x, torch.ones(2, 8, 1, 1)).reshape(1, 2, 6, 4).softmax(-1),
        (1, 8, 4, 6),
    ),
    "rank-3-after-conv1d": (
        lambda x: nn.functional.conv1d(x, torch.ones(2, 8, 1)).softmax(-1),
        (1, 8, 6),
    ),
}


@pytest.mark.parametrize("case", list(LEFT_ALONE))
def test_a_softmax_over_the_last_dim_of_a_row_major_tensor_is_left_alone(case: str) -> None:
    fn, shape = LEFT_ALONE[case]
    model, x = Apply(fn).eval(), torch.randn(shape)
    gm, record = run_pass(SoftmaxOverLastDim(), exported(model, x), x)
    assert record.rewrites == 0
    assert count(gm, aten.reshape.default) == count(exported(model, x), aten.reshape.default)


def test_a_nan_or_infinity_after_a_conv_spoils_its_own_row_as_in_eager() -> None:
    torch.manual_seed(0)
    model, x = ConvSoftmax(lambda y: y.softmax(-1)).eval(), torch.randn(1, 8, 4, 6)
    x[0, 1, 2, 3], x[0, 0, 0, 0], x[0, 4, 1, 2] = float("nan"), float("inf"), float("-inf")
    gm, _ = run_pass(SoftmaxOverLastDim(), exported(model, x), x)
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert_same_nonfinite(expected, got, atol=1e-6)
