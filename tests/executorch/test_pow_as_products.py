"""``pow_as_products``: ``pow`` with the exponents ATen computes without ``pow``, as those ops."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxmobile.executorch.passes.pow_as_products import PowAsProducts
from tests.export_helpers import assert_same_nonfinite, aten, count, exported, program_of, run_pass

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


class Power(nn.Module):
    def __init__(self, exponent: float) -> None:
        super().__init__()
        self.exponent = exponent

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.pow(self.exponent) * 2.0


def special() -> torch.Tensor:
    """NaN, both infinities, both zeros, tiny, huge and negative values, and random ones."""
    torch.manual_seed(0)
    values = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-30, -1e-30, 1e30, -3.0]
    return torch.cat([torch.tensor(values), torch.randn(29 * 138 - 9) * 10]).reshape(1, 29, 138)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The float32 bit patterns, NaN included: equal bits are the same value."""
    return t.view(torch.int32)


@pytest.mark.parametrize("exponent", [2, 2.0, 3, 3.0, -1, -1.0, -2, -2.0, 1, 1.0])
def test_each_exponent_is_the_ops_aten_computes_it_with_bit_for_bit(exponent: float) -> None:
    model, x = Power(exponent).eval(), special()
    gm, record = run_pass(PowAsProducts(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.pow.Tensor_Scalar) == 0
    with torch.no_grad():
        assert torch.equal(bits(gm(x)), bits(model(x)))


def test_a_zero_dim_base_keeps_its_shape() -> None:
    model, x = Power(-2).eval(), torch.tensor(3.0)
    gm, _ = run_pass(PowAsProducts(), exported(model, x), x)
    assert gm(x).shape == torch.Size([])
    assert torch.equal(gm(x), model(x))


@pytest.mark.parametrize(
    ("exponent", "reason"),
    [
        (4, "exponent 4: ATen computes it with pow, which products would not match"),
        (0.0, "exponent 0.0: ATen computes it with pow, which products would not match"),
        (1.5, "exponent 1.5: ATen computes it with pow, which products would not match"),
        (0.5, "exponent 0.5: XNNPACK's sqrt is NaN at +inf, where eager's pow is +inf"),
        (-0.5, "exponent -0.5: XNNPACK's rsqrt is NaN at 0, where eager's pow is +inf"),
    ],
)
def test_other_exponents_are_left_alone_with_the_reason(exponent: float, reason: str) -> None:
    model, x = Power(exponent).eval(), torch.randn(3, 4)
    gm, record = run_pass(PowAsProducts(), exported(model, x), x)
    assert (record.rewrites, record.skips) == (0, {reason: 1})
    assert count(gm, aten.pow.Tensor_Scalar) == 1


def test_other_dtypes_are_left_alone_with_the_reason() -> None:
    model, x = Power(2.0).eval(), torch.randn(3, 4, dtype=torch.float64)
    _, record = run_pass(PowAsProducts(), exported(model, x), x)
    assert record.skips == {"torch.float64 base: the XNNPACK delegate computes float32": 1}


class Powers(nn.Module):
    """The exponents ExecuTorch leaves on portable kernels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.pow(2.0) + x.pow(3.0) + x.pow(-1) + x.pow(-2.0)


def test_the_program_is_one_delegate_call_and_keeps_eagers_nan_and_infinities() -> None:
    from fxmobile.executorch.export import export_module
    from fxmobile.executorch.lower import lower
    from fxmobile.executorch.runtime import ProgramRunner

    model, x = Powers().eval(), torch.randn(1, 4, 8, 8)
    before = program_of(exported(model, x), x)
    assert "aten.pow.Tensor_Scalar" in {p.op for p in before.portable_ops}
    gm, _ = run_pass(PowAsProducts(), exported(model, x), x)
    exported_again = export_module(gm, (x,), "rewritten")
    lowered = lower(exported_again, "rewritten")
    assert (lowered.facts.delegate_calls, lowered.facts.portable_ops) == (1, ())
    run = ProgramRunner(lowered.buffer, exported_again.call_spec.out_spec)
    x[0, 0, 0, :5] = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0])
    expected, got = model(x), run(x)
    assert_same_nonfinite(expected, got, rtol=1e-5)
