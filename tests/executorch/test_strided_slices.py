"""``strided_slices``: slices with a step as reshapes around a slice of step 1."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import fx

from fxmobile.executorch.passes.strided_slices import StridedSlices, can_restride
from tests.export_helpers import (
    Apply,
    assert_same_nonfinite,
    aten,
    count,
    exported,
    program_of,
    run_pass,
)

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


def special(shape: tuple[int, ...]) -> torch.Tensor:
    """Random values with a NaN, both infinities and a -0 among them."""
    torch.manual_seed(0)
    x = torch.randn(shape)
    flat = x.view(-1)
    flat[::7][:4] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])
    return x


CASES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], int]] = {
    # LeViT's and Swin's downsampling on [B, H, W, C], H and W even: rows of 2 fill the dim
    "downsample": (lambda x: x[:, ::2, ::2], 2),
    "odd-start": (lambda x: x[:, 1::2, :, 1::3], 2),
    # 7 elements, 4 selected: rows of 2 need 8, the dim is padded with one zero
    "downsample-odd": (lambda x: x[:, :, ::2], 1),
    "start-and-end": (lambda x: x[:, 1:6:3], 1),  # reads x[:, 0:6] as 2 rows of 3
    "late-start": (lambda x: x[:, :, 4::2], 1),  # rows 2 and 3 of 2: padded to 8, then x[4:8]
    "step-larger-than-the-dim": (lambda x: x[..., ::9], 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_strided_slice_becomes_reshapes_and_the_values_are_eagers(case: str) -> None:
    fn, strided = CASES[case]
    model, x = Apply(lambda x: fn(x) * 2.0).eval(), special((2, 8, 7, 6))
    gm = exported(model, x)
    assert sum(1 for n in gm.graph.nodes if n.target is aten.slice.Tensor) >= strided
    gm, record = run_pass(StridedSlices(), gm, x)
    assert record.rewrites == strided
    steps = [n.args[4] for n in gm.graph.nodes if n.target is aten.slice.Tensor and len(n.args) > 4]
    assert set(steps) <= {1}
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert_same_nonfinite(expected, got)
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())  # copies: exact
    assert torch.equal(got.signbit(), expected.signbit())


def test_levit_downsampling_of_an_odd_grid_lowers_to_one_delegate_call() -> None:
    model, x = Apply(lambda x: x[:, ::2, ::2] * 2.0).eval(), torch.randn(1, 7, 7, 16)
    before = program_of(exported(model, x), x)
    assert "aten.slice_copy.Tensor" in {p.op for p in before.portable_ops}
    gm, _ = run_pass(StridedSlices(), exported(model, x), x)
    assert count(gm, aten.constant_pad_nd.default) == 2
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_a_slice_of_step_one_is_no_candidate_and_an_empty_one_is_left() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2, 6)
    empty = graph.call_function(aten.slice.Tensor, (x, 1, 5, 2, 2))
    empty.meta["val"] = torch.empty(2, 0)
    plain = graph.call_function(aten.slice.Tensor, (x, 1, 0, 4, 1))
    plain.meta["val"] = torch.empty(2, 4)
    graph.output((empty, plain))
    assert can_restride(empty) == "an empty result"
    assert can_restride(plain) is None
