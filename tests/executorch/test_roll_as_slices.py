"""``roll_as_slices``: ``torch.roll`` by static shifts as slices and a concatenation."""

from __future__ import annotations

import pytest
import torch
from torch import fx

from fxmobile.executorch.passes.roll_as_slices import RollAsSlices, can_roll
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
    flat[:4] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])
    return x


CASES = {
    # Swin's shifted windows on [B, H, W, C]: back and forth by (-3, -3) over (1, 2)
    "swin": (lambda x: torch.roll(x, (-3, -3), (1, 2)) * 2.0, 2),
    "one-dim": (lambda x: torch.roll(x, 2, 3) * 2.0, 1),
    "negative-dims": (lambda x: torch.roll(x, (1, -10), (-1, -3)) * 2.0, 2),
    "flat": (lambda x: torch.roll(x, 5) * 2.0, 1),  # no dims: over the flattened tensor
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_roll_becomes_slices_and_cats_and_the_values_are_eagers(case: str) -> None:
    fn, cats = CASES[case]
    model, x = Apply(fn).eval(), special((2, 7, 7, 5))
    gm, record = run_pass(RollAsSlices(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.roll.default) == 0
    assert count(gm, aten.cat.default) == cats
    assert count(gm, aten.slice.Tensor) == 2 * cats
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert_same_nonfinite(expected, got)
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())  # copies: exact
    assert torch.equal(got.signbit(), expected.signbit())


def test_a_shift_by_whole_turns_moves_nothing() -> None:
    model, x = Apply(lambda x: torch.roll(x, (7, -14), (1, 2)) + 1.0).eval(), special((1, 7, 7, 2))
    gm, record = run_pass(RollAsSlices(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.cat.default) == 0
    assert torch.equal(gm(x).nan_to_num(), model(x).nan_to_num())


def test_swin_roll_lowers_to_one_delegate_call_without_portable_ops() -> None:
    model, x = Apply(CASES["swin"][0]).eval(), torch.randn(1, 14, 14, 8)
    before = program_of(exported(model, x), x)
    assert {"aten.index_select", "aten.fmod.Scalar"} <= {p.op for p in before.portable_ops}
    gm, _ = run_pass(RollAsSlices(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_without_shapes_it_declines() -> None:
    graph = fx.Graph()
    rolled = graph.call_function(aten.roll.default, (graph.placeholder("x"), [1], [0]))
    graph.output(rolled)
    assert can_roll(rolled) == "input shape unknown or symbolic (pass example_inputs)"
