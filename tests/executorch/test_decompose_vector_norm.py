"""``decompose_vector_norm``: a 2-norm as ``sqrt(sum(x * x))``, whose sum ``decompose_mean`` then
makes a matmul, so XNNPACK takes what ExecuTorch's lowering leaves on portable kernels."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from fxmobile.executorch.passes.decompose_mean import DecomposeMean
from fxmobile.executorch.passes.decompose_vector_norm import DecomposeVectorNorm
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


# (the norm, the input's shape)
CASES = {
    "normalize": (lambda x: F.normalize(x, dim=-1), (2, 5, 16)),  # EdgeNeXt's q and k
    "two-dims-kept": (lambda x: x.norm(dim=(1, 2), keepdim=True), (2, 3, 4, 5)),
    "all": (lambda x: torch.linalg.vector_norm(x), (3, 7)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_2_norm_becomes_its_sum_of_squares_and_matches_float64(name: str) -> None:
    f, shape = CASES[name]
    torch.manual_seed(0)
    model, x = Apply(f).eval(), torch.randn(shape) * 3
    gm, record = run_pass(DecomposeVectorNorm(), exported(model, x), x)
    assert record.rewrites == 1 and record.skips == {}
    assert count(gm, aten.linalg_vector_norm.default) == 0
    assert count(gm, aten.sqrt.default) == 1 and count(gm, aten.sum.dim_IntList) == 1
    assert_equivalent(model, gm, x)


@pytest.mark.parametrize("name", list(CASES))
def test_a_nan_or_infinity_reaches_the_outputs_it_reaches_in_eager(name: str) -> None:
    f, shape = CASES[name]
    torch.manual_seed(0)
    model, x = Apply(f).eval(), torch.randn(shape)
    flat = x.view(-1)
    flat[0], flat[-1] = float("nan"), float("inf")
    gm, _ = run_pass(DecomposeVectorNorm(), exported(model, x), x)
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert not expected.isfinite().all()
    assert_same_nonfinite(expected, got, atol=1e-5)


def test_own_flow_leaves_the_norm_on_portable_kernels_and_this_does_not() -> None:
    """EdgeNeXt's 18 portable ops were 6 of these norms: pow, sum and pow each. (The
    ``expand_copy`` of ``F.normalize`` is ``remove_expands``'s.)"""
    model, x = Apply(lambda x: F.normalize(x, dim=-1)).eval(), torch.randn(2, 5, 16)
    norm_ops = {"aten.pow.Tensor_Scalar", "aten.sum.dim_IntList"}
    before = program_of(exported(model, x), x)
    assert norm_ops <= {p.op for p in before.portable_ops}
    gm, _ = run_pass(DecomposeVectorNorm(), exported(model, x), x)
    gm, _ = run_pass(DecomposeMean(), gm, x)
    after = program_of(gm, x)
    assert after.delegate_calls >= 1
    assert not norm_ops & {p.op for p in after.portable_ops}


@pytest.mark.parametrize(
    "f", [lambda x: x.norm(p=1, dim=-1), lambda x: x.norm(p=float("inf"), dim=-1)], ids=["1", "inf"]
)
def test_another_order_is_no_candidate(f: Callable[[torch.Tensor], torch.Tensor]) -> None:
    x = torch.randn(2, 8)
    gm, record = run_pass(DecomposeVectorNorm(), exported(Apply(f), x), x)
    assert (record.rewrites, dict(record.skips)) == (0, {})
    assert count(gm, aten.linalg_vector_norm.default) == 1


@pytest.mark.parametrize(
    ("f", "x", "reason"),
    [
        (
            lambda x: x.norm(dim=-1),
            torch.randn(2, 8, dtype=torch.float64),
            "torch.float64 input: the XNNPACK delegate computes float32",
        ),
        (
            lambda x: torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64),
            torch.randn(2, 8),
            "a dtype= argument",
        ),
    ],
    ids=["float64", "dtype"],
)
def test_what_it_cannot_rewrite_is_left_alone_with_the_reason(
    f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, reason: str
) -> None:
    gm, record = run_pass(DecomposeVectorNorm(), exported(Apply(f), x), x)
    assert record.rewrites == 0 and record.skips == {reason: 1}
    assert count(gm, aten.linalg_vector_norm.default) == 1
