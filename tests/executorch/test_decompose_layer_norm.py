"""``decompose_layer_norm``: LayerNorm as matmuls and elementwise ops the XNNPACK delegate takes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxmobile.executorch.passes.decompose_layer_norm import DecomposeLayerNorm
from tests.export_helpers import (
    assert_same_nonfinite,
    aten,
    count,
    exported,
    program_of,
    run_pass,
)
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


class Tokens(nn.Module):
    def __init__(self, shape: tuple[int, ...] = (16,), affine: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(shape, elementwise_affine=affine)
        if affine:
            with torch.no_grad():
                self.norm.weight.normal_()
                self.norm.bias.normal_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


@pytest.mark.parametrize(
    ("shape", "normalized", "affine"),
    [
        ((2, 5, 16), (16,), True),
        ((2, 5, 16), (16,), False),
        ((3, 4, 6), (4, 6), True),  # two normalized dims
        ((7, 16), (16,), True),
        ((16,), (16,), True),  # no lead dims at all
    ],
    ids=["tokens", "no-affine", "two-dims", "rows", "vector"],
)
def test_every_layer_norm_becomes_matmuls_and_matches_float64(
    shape: tuple[int, ...], normalized: tuple[int, ...], affine: bool
) -> None:
    torch.manual_seed(0)
    model, x = Tokens(normalized, affine).eval(), torch.randn(shape) * 3 + 1
    gm, record = run_pass(DecomposeLayerNorm(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.layer_norm.default) == 0
    assert count(gm, aten.linear.default) == 2  # the mean and the variance
    assert count(gm, aten.rsqrt.default) == 1
    assert_equivalent(model, gm, x)


def test_a_nan_or_infinity_spoils_its_row_only_as_in_eager() -> None:
    torch.manual_seed(0)
    model = Tokens().eval()
    x = torch.randn(2, 5, 16)
    x[0, 1, 3], x[1, 2, 0], x[1, 4, 7] = float("nan"), float("inf"), float("-inf")
    gm, _ = run_pass(DecomposeLayerNorm(), exported(model, x), x)
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert_same_nonfinite(expected, got, atol=1e-5)


def test_the_program_is_one_delegate_call_without_portable_ops() -> None:
    torch.manual_seed(0)
    model, x = Tokens().eval(), torch.randn(2, 5, 16)
    before = program_of(exported(model, x), x)
    assert [p.op for p in before.portable_ops] == ["aten.native_layer_norm"]
    gm, _ = run_pass(DecomposeLayerNorm(), exported(model, x), x)
    after = program_of(gm, x)
    assert after.delegate_calls == 1
    assert after.portable_ops == ()


def test_other_dtypes_are_left_alone_with_the_reason() -> None:
    model, x = Tokens().double().eval(), torch.randn(2, 5, 16, dtype=torch.float64)
    gm, record = run_pass(DecomposeLayerNorm(), exported(model, x), x)
    assert record.rewrites == 0
    assert record.skips == {"torch.float64 input: the XNNPACK delegate computes float32": 1}
    assert count(gm, aten.layer_norm.default) == 1


def test_without_shapes_it_declines() -> None:
    model, x = Tokens().eval(), torch.randn(2, 5, 16)
    gm = exported(model, x)
    for node in gm.graph.nodes:  # as if nothing had run: no recorded shapes
        node.meta.pop("val", None)
        node.meta.pop("tensor_meta", None)
    from fxmobile.executorch.passes.decompose_layer_norm import can_decompose

    norm = next(n for n in gm.graph.nodes if n.target is aten.layer_norm.default)
    assert can_decompose(norm) == "input shape unknown (pass example_inputs)"
