"""``matmul_as_bmm``: matmuls of activations as ``bmm`` between reshapes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxmobile.executorch.passes.matmul_as_bmm import MatmulAsBmm, can_batch
from tests.export_helpers import assert_same_nonfinite, aten, count, exported, program_of, run_pass
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


class Product(nn.Module):
    """``a @ b``, with ``b`` transposed when asked (attention's ``q @ k.transpose(-2, -1)``)."""

    def __init__(self, transpose: bool = False) -> None:
        super().__init__()
        self.transpose = transpose

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ (b.transpose(-2, -1) if self.transpose else b)


class Weighted(nn.Module):
    """``x @ W``: a 2-D parameter as the right side."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


@pytest.mark.parametrize(
    ("a", "b", "transpose"),
    [
        ((2, 3, 5, 8), (2, 3, 5, 8), True),  # attention scores
        ((2, 3, 5, 5), (2, 3, 5, 8), False),  # attention output
        ((2, 2, 3, 4, 6), (2, 2, 3, 6, 4), False),  # rank 5
        ((3, 4, 8), (3, 8, 5), False),  # rank 3 (ExecuTorch expands it too)
        ((4, 8), (8, 5), False),  # two activations, 2-D: mm needs a static weight
        ((3, 4, 8), (8, 5), False),  # a 2-D activation on the right: folded into one batch
    ],
    ids=["scores", "output", "rank-5", "rank-3", "2-d", "folded"],
)
def test_each_matmul_becomes_one_bmm_and_matches_float64(
    a: tuple[int, ...], b: tuple[int, ...], transpose: bool
) -> None:
    torch.manual_seed(0)
    model, inputs = Product(transpose).eval(), (torch.randn(a), torch.randn(b))
    gm, record = run_pass(MatmulAsBmm(), exported(model, *inputs), *inputs)
    assert record.rewrites == 1
    assert count(gm, aten.matmul.default) == 0
    assert count(gm, aten.bmm.default) == 1
    assert_equivalent(model, gm, *inputs)


def test_a_nan_or_infinity_reaches_the_same_outputs_as_in_eager() -> None:
    torch.manual_seed(0)
    model = Product(transpose=True).eval()
    a, b = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    a[0, 0, 1, 3], b[0, 1, 2, 0], b[0, 1, 3, 5] = float("nan"), float("inf"), float("-inf")
    gm, _ = run_pass(MatmulAsBmm(), exported(model, a, b), a, b)
    with torch.no_grad():
        expected, got = model(a, b), gm(a, b)
    assert_same_nonfinite(expected, got, atol=1e-5)


def test_own_flow_leaves_two_expand_copies_and_this_leaves_none() -> None:
    torch.manual_seed(0)
    model, inputs = (
        Product(transpose=True).eval(),
        (torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)),
    )
    before = program_of(exported(model, *inputs), *inputs)
    assert [(p.op, p.count) for p in before.portable_ops] == [("aten.expand_copy", 2)]
    gm, _ = run_pass(MatmulAsBmm(), exported(model, *inputs), *inputs)
    after = program_of(gm, *inputs)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_a_static_weight_on_the_right_is_no_candidate() -> None:
    """``x @ W`` lowers to ``mm`` with a packed weight, which XNNPACK takes: no bmm."""
    model, x = Weighted().eval(), torch.randn(3, 4, 8)
    gm, record = run_pass(MatmulAsBmm(), exported(model, x), x)
    assert (record.rewrites, dict(record.skips)) == (0, {})
    assert count(gm, aten.matmul.default) == 1


@pytest.mark.parametrize(
    ("model", "inputs", "reason"),
    [
        (
            Product(),
            (torch.randn(2, 3, 4, 8), torch.randn(1, 3, 8, 5)),
            "batch dims [2, 3] and [1, 3] broadcast",
        ),
        (Product(), (torch.randn(4, 8), torch.randn(2, 8, 5)), "batch dims [] and [2] broadcast"),
        (
            Product(),
            (torch.randn(3, 4, 8), torch.randn(8)),
            "a 1-D operand (a matrix-vector product)",
        ),
        (
            Product(),
            (torch.randn(3, 4, 8, dtype=torch.float64), torch.randn(3, 8, 5, dtype=torch.float64)),
            "torch.float64 @ torch.float64: the XNNPACK delegate computes float32",
        ),
    ],
    ids=["broadcast-batch", "broadcast-left", "vector", "float64"],
)
def test_what_it_cannot_batch_is_left_alone_with_the_reason(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], reason: str
) -> None:
    gm, record = run_pass(MatmulAsBmm(), exported(model, *inputs), *inputs)
    assert record.rewrites == 0
    assert record.skips == {reason: 1}
    assert count(gm, aten.matmul.default) == 1


def test_without_shapes_it_declines() -> None:
    inputs = (torch.randn(2, 3, 4, 8), torch.randn(2, 3, 8, 5))
    gm = exported(Product(), *inputs)
    for node in gm.graph.nodes:  # as if nothing had run: no recorded shapes
        node.meta.pop("val", None)
        node.meta.pop("tensor_meta", None)
    matmul = next(n for n in gm.graph.nodes if n.target is aten.matmul.default)
    assert can_batch(matmul) == "input shape unknown (pass example_inputs)"
