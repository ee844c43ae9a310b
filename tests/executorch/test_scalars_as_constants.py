"""``scalars_as_constants``: numbers in float32 arithmetic, and hardsigmoid's, as constants."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from fxmobile.executorch.passes.scalars_as_constants import ScalarsAsConstants
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
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_numbers_become_float32_constants_and_the_values_stay_bit_equal(case: str) -> None:
    torch.manual_seed(0)
    model = Apply(CASES[case]).eval()
    x = torch.randn(2, 8, 4, 4) * 5
    x[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    gm, record = run_pass(ScalarsAsConstants(), exported(model, x), x)
    assert record.rewrites >= 1
    assert count(gm, aten.hardsigmoid.default) == 0
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert_same_nonfinite(expected, got)
    finite = expected.isfinite()
    assert torch.equal(got[finite], expected[finite])  # the same float32 ops, in ATen's order


def test_hardsigmoid_loses_its_dtype_copies_outside_the_delegate() -> None:
    model, x = Apply(lambda x: F.hardsigmoid(x) * x).eval(), torch.randn(1, 8, 4, 4)
    before = program_of(exported(model, x), x)
    assert [p.op for p in before.portable_ops] == ["dim_order_ops._to_dim_order_copy"]
    gm, _ = run_pass(ScalarsAsConstants(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_other_dtypes_and_alpha_are_left_alone_with_the_reason() -> None:
    model = Apply(lambda x: torch.add(x.double() + 1, 2, alpha=3).float()).eval()
    x = torch.randn(2, 3)
    _, record = run_pass(ScalarsAsConstants(), exported(model, x), x)
    assert record.rewrites == 0
    assert record.skips == {
        "torch.float64 tensor: the XNNPACK delegate computes float32": 1,
        "alpha is not 1": 1,
    }
