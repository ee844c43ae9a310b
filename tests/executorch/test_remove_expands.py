"""``remove_expands``: broadcasts left to broadcasting ops, or done by a multiplication by ones."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.executorch.passes.remove_expands import MAX_ONES, RemoveExpands, can_remove
from tests.export_helpers import assert_same_nonfinite, aten, count, exported, program_of, run_pass
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


class Function(nn.Module):
    def __init__(self, f: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.f = f

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.f(*xs)


class Token(nn.Module):
    """ViT's class token: a parameter expanded to the batch and put before the patches."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)


def normalize(x: torch.Tensor) -> torch.Tensor:
    """``F.normalize`` as torch writes it: ``x / norm.clamp_min(eps).expand_as(x)``."""
    return F.normalize(x, dim=-1)


@pytest.mark.parametrize(
    ("f", "shapes"),
    [
        (normalize, [(1, 4, 12, 16)]),
        (lambda x, y: x.expand(2, 3, 5) + y, [(3, 1), (2, 3, 5)]),
        (lambda x, y: y - x.expand(2, 3, 5), [(1, 3, 5), (2, 3, 5)]),
        (lambda x, y: torch.maximum(x.expand(4, 6), y) * x.expand(4, 6), [(4, 1), (4, 6)]),
        (lambda x, y: torch.where(y > 0, x.expand(3, 4), y), [(1, 4), (3, 4)]),
        (lambda x, y: torch.where(x.expand(3, 4) > 0, y, -y), [(1, 4), (3, 4)]),  # gt: ones
    ],
    ids=["normalize", "add", "sub", "max-and-mul", "where", "compare"],
)
def test_expands_become_broadcasts_and_match_float64(
    f: Callable[..., torch.Tensor], shapes: list[tuple[int, ...]]
) -> None:
    torch.manual_seed(0)
    model, inputs = Function(f).eval(), tuple(torch.randn(s) for s in shapes)
    gm, record = run_pass(RemoveExpands(), exported(model, *inputs), *inputs)
    assert record.rewrites >= 1
    assert count(gm, aten.expand.default) == 0
    assert_equivalent(model, gm, *inputs)


def test_a_broadcast_its_users_take_adds_no_op() -> None:
    model, inputs = (
        Function(lambda x, y: x.expand(2, 3, 5) + y).eval(),
        (
            torch.randn(3, 1),
            torch.randn(2, 3, 5),
        ),
    )
    gm, _ = run_pass(RemoveExpands(), exported(model, *inputs), *inputs)
    assert count(gm, aten.mul.Tensor) == 0
    assert count(gm, aten.add.Tensor) == 1


def test_a_broadcast_a_cat_needs_is_a_multiplication_by_ones_over_the_new_dims() -> None:
    torch.manual_seed(0)
    model, x = Token().eval(), torch.randn(3, 5, 8)
    gm, record = run_pass(RemoveExpands(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.expand.default) == 0
    ones = [n for n in gm.graph.nodes if n.op == "get_attr" and "expand_ones" in str(n.target)]
    assert [tuple(getattr(gm, str(n.target)).shape) for n in ones] == [(3, 1, 1)]
    assert_equivalent(model, gm, x)


def test_an_operand_that_would_shrink_the_output_keeps_its_broadcast() -> None:
    """``expand(x, [2, 3]) + y`` with y [3]: without the expand the sum would be [3]."""
    torch.manual_seed(0)
    model = Function(lambda x, y: x.expand(2, 3) + y).eval()
    inputs = (torch.randn(3), torch.randn(3))
    gm, record = run_pass(RemoveExpands(), exported(model, *inputs), *inputs)
    assert record.rewrites == 1
    assert count(gm, aten.mul.Tensor) == 1  # by ones of [2, 1]
    assert_equivalent(model, gm, *inputs)


def test_nan_and_infinities_are_repeated_as_in_eager() -> None:
    model = Function(lambda x, y: torch.cat([x.expand(2, 3, 4), y], 0)).eval()
    x = torch.tensor([[[float("nan"), float("inf"), float("-inf"), -0.0]]]).expand(1, 3, 4).clone()
    y = torch.randn(1, 3, 4)
    gm, _ = run_pass(RemoveExpands(), exported(model, x, y), x, y)
    with torch.no_grad():
        expected, got = model(x, y), gm(x, y)
    assert_same_nonfinite(expected, got)
    assert torch.equal(got.signbit(), expected.signbit())


def test_own_flow_leaves_expand_copy_and_this_leaves_none() -> None:
    torch.manual_seed(0)
    model, x = Token().eval(), torch.randn(2, 5, 8)
    before = program_of(exported(model, x), x)
    assert [p.op for p in before.portable_ops] == ["aten.expand_copy"]
    gm, _ = run_pass(RemoveExpands(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_ones_over_the_bound_are_split_over_their_dims() -> None:
    """timm's EvoNorm expands its group statistics, [1, G, 1, 1, 1] to [1, G, 16, 128, 128]:
    ones of 262144 elements, multiplied as [1, 1, 16, 128, 1] and [1, 1, 1, 1, 128]."""
    model = Function(lambda x: x.expand(1, 2, 16, 128, 128).reshape(1, 32, 128, 128)).eval()
    x = torch.randn(1, 2, 1, 1, 1)
    x[0, 1] = float("nan")
    gm, record = run_pass(RemoveExpands(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.expand.default) == 0
    ones = sorted(tuple(b.shape) for b in gm.buffers())
    assert ones == [(1, 1, 1, 1, 128), (1, 1, 16, 128, 1)]
    with torch.no_grad():
        assert torch.equal(gm(x).isnan(), model(x).isnan())
        assert torch.equal(gm(x).nan_to_num(), model(x).nan_to_num())
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_a_no_op_expand_is_no_candidate() -> None:
    model, x = Function(lambda x: x.expand(1, 4, 8) * 2.0).eval(), torch.randn(1, 4, 8)
    _, record = run_pass(RemoveExpands(), exported(model, x), x)
    assert (record.rewrites, dict(record.skips)) == (0, {})


@pytest.mark.parametrize(
    ("f", "x", "reason"),
    [
        (
            lambda x: torch.cat([x.expand(3, 4), x.expand(3, 4)], 0),
            torch.ones(1, 4, dtype=torch.int64),
            "torch.int64 expand used other than by a broadcasting op (a multiplication by "
            "ones would be float32)",
        ),
        (
            lambda x: torch.cat([x.expand(MAX_ONES + 1, 2), x.expand(MAX_ONES + 1, 2)], 1),
            torch.randn(1, 2),
            f"ones of a dim over {MAX_ONES} elements for a multiplication",
        ),
    ],
    ids=["int64", "large"],
)
def test_what_it_cannot_remove_is_left_alone_with_the_reason(
    f: Callable[..., torch.Tensor], x: torch.Tensor, reason: str
) -> None:
    gm, record = run_pass(RemoveExpands(), exported(Function(f), x), x)
    assert record.rewrites == 0
    assert record.skips == {reason: 2}
    assert count(gm, aten.expand.default) == 2


def test_without_shapes_it_declines() -> None:
    model, x = Token().eval(), torch.randn(3, 5, 8)
    gm = exported(model, x)
    for node in gm.graph.nodes:  # as if nothing had run: no recorded shapes
        node.meta.pop("val", None)
        node.meta.pop("tensor_meta", None)
    expand = next(n for n in gm.graph.nodes if n.target is aten.expand.default)
    assert can_remove(expand) == "input or output shape unknown (pass example_inputs)"
