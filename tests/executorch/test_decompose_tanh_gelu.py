"""``decompose_tanh_gelu``: the tanh GELU written out, since XNNPACK computes the erf GELU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.executorch.passes.decompose_tanh_gelu import DecomposeTanhGelu
from tests.export_helpers import (
    assert_same_nonfinite,
    aten,
    count,
    exported,
    program_outputs,
    run_pass,
)
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


class Gelu(nn.Module):
    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate=self.approximate)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.double() - expected).abs().max() / expected.abs().max())


@pytest.mark.parametrize(
    "shape", [(2, 5, 16), (1, 8, 4, 4), (7,), ()], ids=["tokens", "nchw", "vector", "0-d"]
)
def test_the_tanh_gelu_becomes_its_formula_and_matches_float64(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model, x = Gelu().eval(), torch.randn(shape) * 3
    gm, record = run_pass(DecomposeTanhGelu(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.gelu.default) == 0
    assert count(gm, aten.tanh.default) == 1
    assert_equivalent(model, gm, x)
    assert gm(x).shape == x.shape  # its constants broadcast no further: a 0-d x stays 0-d


def test_nan_and_infinities_come_out_as_in_eager() -> None:
    """NaN stays NaN, +inf stays +inf, -inf gives NaN (0.5 * -inf * 0), as eager's kernel."""
    model = Gelu().eval()
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), -1e13, 1e13, -20.0, 0.0, 3.0])
    gm, _ = run_pass(DecomposeTanhGelu(), exported(model, x), x)
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert_same_nonfinite(expected, got, atol=0, rtol=0)


def test_own_program_computes_the_erf_gelu_and_the_rewritten_one_the_tanh_gelu() -> None:
    """The bug this pass fixes: ExecuTorch's XNNPACK delegate takes ``gelu(approximate="tanh")``
    and runs its erf GELU (measured: 3.5e-5 of the output's scale off on this input, 1e-4 on
    others); written out, the program is within float32 rounding (5.7e-8 measured)."""
    torch.manual_seed(0)
    model, x = Gelu().eval(), torch.randn(1, 64, 48) * 3
    expected = F.gelu(x.double(), approximate="tanh")
    own = program_outputs(exported(model, x), x)
    assert relative_error(own, expected) > 1e-5
    assert relative_error(own, F.gelu(x.double())) < 1e-6  # it is the erf GELU
    gm, _ = run_pass(DecomposeTanhGelu(), exported(model, x), x)
    assert relative_error(program_outputs(gm, x), expected) < 1e-6


def test_the_erf_gelu_is_no_candidate() -> None:
    model, x = Gelu("none").eval(), torch.randn(2, 5, 16)
    gm, record = run_pass(DecomposeTanhGelu(), exported(model, x), x)
    assert (record.rewrites, dict(record.skips)) == (0, {})
    assert count(gm, aten.gelu.default) == 1


def test_another_dtype_is_left_alone_with_the_reason() -> None:
    x = torch.randn(2, 16, dtype=torch.float64)
    gm, record = run_pass(DecomposeTanhGelu(), exported(Gelu(), x), x)
    assert record.rewrites == 0
    assert record.skips == {"torch.float64 input: the XNNPACK delegate computes float32": 1}
    assert count(gm, aten.gelu.default) == 1
