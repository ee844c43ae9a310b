"""``pad_as_slices``: reflect and replicate padding as one-element slices and a concatenation."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from fxmobile.executorch.passes.pad_as_slices import PadAsSlices, can_slice
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
    """Random values with a NaN, both infinities and a -0 at the borders that get copied."""
    torch.manual_seed(0)
    x = torch.randn(shape)
    x[..., 0, 1], x[..., 1, 0], x[..., -1, -2], x[..., -2, -1] = (
        float("nan"),
        float("inf"),
        float("-inf"),
        -0.0,
    )
    return x


CASES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[int, ...]]] = {
    "reflect": (lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), (2, 3, 6, 7)),
    "reflect-uneven": (lambda x: F.pad(x, (2, 3, 0, 1), mode="reflect"), (2, 3, 6, 7)),
    "reflection-pad-2d": (nn.ReflectionPad2d(3), (1, 2, 5, 4)),
    "reflect-1d": (nn.ReflectionPad1d((2, 1)), (2, 3, 5)),
    # a width of 3: the first and the last copy both read the middle column
    "reflect-narrow": (lambda x: F.pad(x, (1, 1, 0, 0), mode="reflect"), (1, 2, 4, 3)),
    "replicate": (lambda x: F.pad(x, (2, 1, 1, 2), mode="replicate"), (2, 3, 6, 7)),
    "replication-pad-3d": (nn.ReplicationPad3d((1, 0, 0, 2, 1, 1)), (1, 2, 3, 4, 5)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_padding_becomes_slices_and_cats_and_the_values_are_eagers(case: str) -> None:
    fn, shape = CASES[case]
    model, x = Apply(lambda x: fn(x) * 2.0).eval(), special(shape)
    gm, record = run_pass(PadAsSlices(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.pad.default) == 0
    assert count(gm, aten.cat.default) >= 1
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert_same_nonfinite(expected, got)
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())  # copies: exact
    assert torch.equal(got.signbit(), expected.signbit())


def test_constant_padding_is_left_to_xnnpack() -> None:
    model, x = Apply(lambda x: F.pad(x, (1, 1, 1, 1), value=0.5)).eval(), torch.randn(1, 2, 4, 4)
    gm, record = run_pass(PadAsSlices(), exported(model, x), x)
    assert (record.rewrites, record.skips) == (0, {})
    assert count(gm, aten.pad.default) == 1


def test_reflect_and_replicate_pads_lower_to_one_delegate_call_without_portable_ops() -> None:
    pad = Apply(
        lambda x: F.pad(x, (2, 2, 1, 1), mode="reflect") + F.pad(x, (1, 3, 2, 0), "replicate")
    )
    model, x = pad.eval(), torch.randn(1, 4, 8, 8)
    before = program_of(exported(model, x), x)
    assert {"aten.index.Tensor", "aten.arange.start_step"} <= {p.op for p in before.portable_ops}
    gm, _ = run_pass(PadAsSlices(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


@pytest.mark.parametrize(
    ("pads", "reason"),
    [([-1, 1], "a negative pad (a crop)"), ([0, 5], "a reflect pad as wide as its dim")],
)
def test_crops_and_reflections_wider_than_the_dim_are_left_alone(
    pads: list[int], reason: str
) -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2, 3, 5)
    padded = graph.call_function(aten.pad.default, (x, pads, "reflect"))
    graph.output(padded)
    assert can_slice(padded) == reason
