"""``scalars_as_constants``: numbers in float32 arithmetic, and hardsigmoid's, as constants."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.executorch.passes.scalars_as_constants import ScalarsAsConstants, can_rewrite
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


CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "int-add": lambda x: x + 1,
    "int-div": lambda x: (x + x) / 2,
    "float-mul": lambda x: x * 0.1,
    "number-first": lambda x: 3 - x,
    "rsub": lambda x: torch.rsub(x, 2.5),
    "hardsigmoid": F.hardsigmoid,
    "addcdiv": lambda x: torch.addcdiv(x, x.flip(-1), x + 3, value=0.5),
    "addcdiv-value-1": lambda x: torch.addcdiv(x.flip(-1), x, x - 1),
    "0-d": lambda x: x.sum() * 0.5 + 1,
    "chain": lambda x: (x + 1) * 2 - 3,
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_numbers_become_float32_constants_and_the_values_stay_bit_equal(case: str) -> None:
    torch.manual_seed(0)
    model = Apply(CASES[case]).eval()
    x = torch.randn(2, 8, 4, 4) * 5
    x[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    gm, record = run_pass(ScalarsAsConstants(), exported(model, x), x)
    assert record.rewrites == sum(1 for n in exported(model, x).graph.nodes if can_rewrite(n))
    assert count(gm, aten.hardsigmoid.default) == count(gm, aten.addcdiv.default) == 0
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert got.shape == expected.shape  # a constant broadcasts no further than its tensor
    assert_same_nonfinite(expected, got, atol=0, rtol=0)  # the same float32 ops, in ATen's order


def test_hardsigmoid_loses_its_dtype_copies_outside_the_delegate() -> None:
    model, x = Apply(lambda x: F.hardsigmoid(x) * x).eval(), torch.randn(1, 8, 4, 4)
    before = program_of(exported(model, x), x)
    assert [p.op for p in before.portable_ops] == ["dim_order_ops._to_dim_order_copy"]
    gm, _ = run_pass(ScalarsAsConstants(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


class Affine(nn.Module):
    """timm's ResMLP scaling, ``addcmul(beta, alpha, x)``, before a linear layer."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.alpha, self.beta = nn.Parameter(torch.randn(16)), nn.Parameter(torch.randn(16))
        self.fc, self.value = nn.Linear(16, 16), value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.addcmul(self.beta, self.alpha, x, value=self.value))


@pytest.mark.parametrize(("value", "copies"), [(1, 1), (0.1, 0)], ids=["int-1", "float"])
def test_addcmul_leaves_no_dtype_copy_and_rounds_only_its_product_apart(
    value: float, copies: int
) -> None:
    """ExecuTorch's own decomposition casts an int ``value`` (the default 1) on a portable
    kernel. ATen fuses addcmul's last multiply and add (one rounding, measured); the rewrite
    and ExecuTorch's decomposition round the product too: close, NaN and infinities as eager."""
    torch.manual_seed(0)
    model, x = Affine(value).eval(), torch.randn(2, 49, 16) * 4
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    before = program_of(exported(model, x), x)
    assert [p.op for p in before.portable_ops] == ["dim_order_ops._to_dim_order_copy"] * copies
    gm, record = run_pass(ScalarsAsConstants(), exported(model, x), x)
    assert (record.rewrites, count(gm, aten.addcmul.default)) == (1, 0)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())
    with torch.no_grad():
        expected, got = model(x), gm(x)
        assert_same_nonfinite(expected, got, rtol=1e-6, atol=1e-6)
        y = torch.randn(2, 49, 16)
        assert_same_nonfinite(model(y), gm(y), rtol=1e-6, atol=1e-6)


def test_other_dtypes_and_alpha_are_left_alone_with_the_reason() -> None:
    model = Apply(
        lambda x: torch.add(x.double() + 1, 2, alpha=3).float() + torch.addcmul(x, x, x.int())
    ).eval()
    x = torch.randn(2, 3)
    _, record = run_pass(ScalarsAsConstants(), exported(model, x), x)
    assert record.rewrites == 0
    assert record.skips == {
        "torch.float64 tensor: the XNNPACK delegate computes float32": 1,
        "alpha is not 1": 1,
        "torch.int32 tensor: the XNNPACK delegate computes float32": 1,
    }
