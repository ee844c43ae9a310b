"""``decompose_group_norm``: GroupNorm as two-stage matmul means and elementwise ops."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxmobile.executorch.passes.decompose_group_norm import DecomposeGroupNorm, can_decompose
from tests.export_helpers import assert_same_nonfinite, aten, count, exported, program_of, run_pass
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


class Norm(nn.Module):
    def __init__(self, groups: int, channels: int, affine: bool = True) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, affine=affine)
        if affine:
            with torch.no_grad():
                self.norm.weight.normal_()
                self.norm.bias.normal_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


@pytest.mark.parametrize(
    ("groups", "shape", "affine", "linears"),
    [
        (1, (2, 8, 6, 5), True, 4),  # PoolFormer's GroupNorm(1, C)
        (4, (2, 8, 6, 5), True, 4),
        (4, (2, 8, 6, 5), False, 4),
        (8, (2, 8, 6, 5), True, 2),  # one channel per group: no second stage
        (2, (3, 8), True, 2),  # [N, C]: one pixel per channel, no first stage
        (2, (1, 4, 3, 2, 5), True, 4),  # 3-D pictures
    ],
    ids=["g1", "g4", "no-affine", "per-channel", "rows", "volume"],
)
def test_every_group_norm_becomes_matmuls_and_matches_float64(
    groups: int, shape: tuple[int, ...], affine: bool, linears: int
) -> None:
    torch.manual_seed(0)
    model, x = Norm(groups, shape[1], affine).eval(), torch.randn(shape) * 2 + 0.5
    gm, record = run_pass(DecomposeGroupNorm(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.group_norm.default) == 0
    assert count(gm, aten.linear.default) == linears  # the means of x and of d * d
    assert count(gm, aten.rsqrt.default) == 1
    assert_equivalent(model, gm, x)


def test_a_nan_or_infinity_spoils_its_group_only_as_in_eager() -> None:
    torch.manual_seed(0)
    model = Norm(4, 8).eval()
    x = torch.randn(2, 8, 4, 4)
    x[0, 1, 2, 3], x[1, 4, 0, 0], x[1, 7, 1, 1] = float("nan"), float("inf"), float("-inf")
    gm, _ = run_pass(DecomposeGroupNorm(), exported(model, x), x)
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert expected.isnan().any() and expected.isfinite().any()
    assert_same_nonfinite(expected, got, atol=1e-5)


def test_the_program_is_one_delegate_call_without_portable_ops() -> None:
    torch.manual_seed(0)
    model, x = Norm(1, 8).eval(), torch.randn(1, 8, 6, 6)
    before = program_of(exported(model, x), x)
    assert [p.op for p in before.portable_ops] == ["aten.native_group_norm"]
    gm, _ = run_pass(DecomposeGroupNorm(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_other_dtypes_are_left_alone_with_the_reason() -> None:
    model, x = Norm(2, 8).double().eval(), torch.randn(2, 8, 4, 4, dtype=torch.float64)
    gm, record = run_pass(DecomposeGroupNorm(), exported(model, x), x)
    assert record.rewrites == 0
    assert record.skips == {"torch.float64 input: the XNNPACK delegate computes float32": 1}
    assert count(gm, aten.group_norm.default) == 1


def test_without_shapes_it_declines() -> None:
    model, x = Norm(2, 8).eval(), torch.randn(2, 8, 4, 4)
    gm = exported(model, x)
    for node in gm.graph.nodes:  # as if nothing had run: no recorded shapes
        node.meta.pop("val", None)
        node.meta.pop("tensor_meta", None)
    norm = next(n for n in gm.graph.nodes if n.target is aten.group_norm.default)
    assert can_decompose(norm) == "input shape unknown (pass example_inputs)"
