"""``upsample_nearest_as_conv_transpose``: nearest upsampling as a depthwise transposed
convolution with a ones weight by whole factors, and a strided slice of it where the output is
no whole multiple of the input."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from fxmobile.executorch.export import export_module
from fxmobile.executorch.lower import lower
from fxmobile.executorch.passes.strided_slices import StridedSlices
from fxmobile.executorch.passes.upsample_nearest_as_conv_transpose import (
    MAX_STEP,
    UpsampleNearestAsConvTranspose,
    can_convolve,
)
from fxmobile.report import ProgramFacts
from tests.export_helpers import assert_same_nonfinite, aten, count, exported, run_pass

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


class Upsample(nn.Module):
    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.options = options

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, mode="nearest", **self.options)


class Neck(nn.Module):
    """YOLO's neck in small: upsample, then a conv over the upsampled and a skip."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.conv = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([self.up(x), skip], 1))


def lowered(gm: fx.GraphModule, *inputs: Any) -> tuple[ProgramFacts, Any]:
    """The facts of the ExecuTorch program lowered from ``gm``, and a runner of it."""
    from fxmobile.executorch.runtime import ProgramRunner

    program = export_module(gm, inputs, "rewritten")
    done = lower(program, "rewritten")
    return done.facts, ProgramRunner(done.buffer, program.call_spec.out_spec)


@pytest.mark.parametrize(
    ("options", "shape"),
    [
        ({"scale_factor": 2}, (1, 3, 5, 4)),
        ({"scale_factor": 2.0}, (2, 3, 4, 4)),
        ({"size": (12, 8)}, (1, 3, 4, 4)),  # an output size: factors 3 and 2
        ({"scale_factor": (3, 1)}, (1, 2, 3, 5)),
        ({"scale_factor": 7}, (1, 2, 3, 3)),
    ],
    ids=["x2", "x2-float", "size", "3-by-1", "x7"],
)
def test_whole_factors_become_a_transposed_conv_that_copies_exactly(
    options: dict[str, Any], shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    model, x = Upsample(**options).eval(), torch.randn(shape)
    gm, record = run_pass(UpsampleNearestAsConvTranspose(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.upsample_nearest2d.vec) == 0
    assert count(gm, aten.conv_transpose2d.input) == 1
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))  # a copy: exact, not within rounding


def test_nan_infinities_and_signed_zeros_are_copied_as_in_eager() -> None:
    model = Upsample(scale_factor=2).eval()
    x = torch.tensor([[[[float("nan"), float("inf")], [float("-inf"), -0.0]]]])
    gm, _ = run_pass(UpsampleNearestAsConvTranspose(), exported(model, x), x)
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert_same_nonfinite(expected, got)


def test_own_flow_leaves_the_upsampling_outside_and_this_program_matches_eager() -> None:
    """One delegate call, and XNNPACK's transposed conv too copies NaN and infinities where
    eager's upsampling does (the conv after it spreads them the same way in both)."""
    torch.manual_seed(0)
    model = Neck().eval()
    x, skip = torch.randn(1, 4, 5, 6), torch.randn(1, 4, 10, 12)
    x[0, 1, 2, 3], x[0, 2, 0, 0], x[0, 3, 4, 5] = float("nan"), float("inf"), float("-inf")
    before, _ = lowered(exported(model, x, skip), x, skip)
    assert "aten.upsample_nearest2d.vec" in {p.op for p in before.portable_ops}
    gm, _ = run_pass(UpsampleNearestAsConvTranspose(), exported(model, x, skip), x, skip)
    after, run = lowered(gm, x, skip)
    assert (after.delegate_calls, after.portable_ops) == (1, ())
    with torch.no_grad():
        expected, got = model(x, skip), run(x, skip)
    assert expected.isnan().any() and expected.isinf().any()
    assert_same_nonfinite(expected, got, atol=1e-5)


class Gate(nn.Module):
    """timm's GhostNetV2 gate in small: pool by 2, a conv, upsample back to the map's size
    (7 -> 3 -> 7), multiply."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv(F.avg_pool2d(x, 2)))
        return x * F.interpolate(gate, size=x.shape[-2:], mode="nearest")


@pytest.mark.parametrize(
    ("options", "shape", "slices"),
    [
        ({"size": (7, 7)}, (1, 3, 3, 3), 2),  # GhostNetV2: steps 3 of an upsampling by 7
        ({"scale_factor": 1.5}, (1, 2, 4, 4), 2),  # 4 -> 6: steps 2 of an upsampling by 3
        ({"size": (9, 8)}, (1, 2, 4, 4), 1),  # steps 4 of one by 9 in H, a factor 2 in W
        ({"size": (7, 10)}, (2, 3, 3, 5), 1),  # steps 3 in H, a factor 2 in W
    ],
    ids=["3-to-7", "x1.5", "size-9x8", "mixed"],
)
def test_other_factors_become_a_strided_slice_of_one_by_whole_factors(
    options: dict[str, Any], shape: tuple[int, ...], slices: int
) -> None:
    torch.manual_seed(0)
    model, x = Upsample(**options).eval(), torch.randn(shape)
    gm, record = run_pass(UpsampleNearestAsConvTranspose(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.upsample_nearest2d.vec) == 0
    assert count(gm, aten.conv_transpose2d.input) == 1
    strided = [n for n in gm.graph.nodes if n.target is aten.slice.Tensor and n.args[4] > 1]
    assert len(strided) == slices
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))


def test_ghostnets_gate_is_one_delegate_call_and_copies_nan_and_infinities() -> None:
    """With ``strided_slices`` after it, as the pipeline runs them: ExecuTorch's own flow leaves
    the upsampling on a portable kernel between two delegate calls (timm's ghostnetv2_100 had
    four: 5 delegate calls). The NaN and the infinity sit in the row and the column the pool
    drops: XNNPACK's average pool turns a NaN into -inf (docs/pages/limits.md)."""
    torch.manual_seed(0)
    model, x = Gate().eval(), torch.randn(1, 4, 7, 7)
    x[0, 1, 6, 3], x[0, 2, 2, 6] = float("nan"), float("inf")
    before, _ = lowered(exported(model, x), x)
    assert "aten.upsample_nearest2d.vec" in {p.op for p in before.portable_ops}
    gm, _ = run_pass(UpsampleNearestAsConvTranspose(), exported(model, x), x)
    gm, record = run_pass(StridedSlices(), gm, x)
    assert record.rewrites == 2
    after, run = lowered(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())
    with torch.no_grad():
        expected, got = model(x), run(x)
    assert expected.isnan().any()
    assert_same_nonfinite(expected, got, atol=1e-5)


@pytest.mark.parametrize(
    ("options", "shape", "reason"),
    [
        (
            {"size": (7, 7)},
            (1, 2, 5, 5),
            f"5x5 -> 7x7: a slice of steps 5x5 of an upsampling by 7x7 (a step over {MAX_STEP} "
            f"makes more than it saves)",
        ),
        (
            # output 12x12, but ATen maps through float(1 / 3.0000001), which rounds down:
            # output row 3 reads input row 0
            {"scale_factor": 3.0000001},
            (1, 2, 4, 4),
            "the op's scale does not copy whole blocks (ATen rounds its source index)",
        ),
    ],
    ids=["step-5", "rounded-scale"],
)
def test_what_is_not_a_whole_block_copy_is_left_alone_with_the_reason(
    options: dict[str, Any], shape: tuple[int, ...], reason: str
) -> None:
    model, x = Upsample(**options).eval(), torch.randn(shape)
    gm, record = run_pass(UpsampleNearestAsConvTranspose(), exported(model, x), x)
    assert record.rewrites == 0
    assert record.skips == {reason: 1}
    assert count(gm, aten.upsample_nearest2d.vec) == 1


def test_other_dtypes_are_left_alone_with_the_reason() -> None:
    model, x = Upsample(scale_factor=2).eval(), torch.randn(1, 2, 3, 3, dtype=torch.float64)
    _, record = run_pass(UpsampleNearestAsConvTranspose(), exported(model, x), x)
    assert record.rewrites == 0
    assert record.skips == {"torch.float64 input: the XNNPACK delegate computes float32": 1}


def test_without_shapes_it_declines() -> None:
    model, x = Upsample(scale_factor=2).eval(), torch.randn(1, 2, 3, 3)
    gm = exported(model, x)
    for node in gm.graph.nodes:  # as if nothing had run: no recorded shapes
        node.meta.pop("val", None)
        node.meta.pop("tensor_meta", None)
    up = next(n for n in gm.graph.nodes if n.target is aten.upsample_nearest2d.vec)
    assert can_convolve(up) == "input shape unknown (pass example_inputs)"
