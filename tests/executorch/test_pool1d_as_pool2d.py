"""``pool1d_as_pool2d``: 1-D poolings as the 2-D poolings of a height-1 view."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from fxmobile.errors import LoweringError
from fxmobile.executorch.passes.pipeline import export_pipeline
from fxmobile.executorch.passes.pool1d_as_pool2d import Pool1dAsPool2d
from tests.export_helpers import (
    Apply,
    assert_same_nonfinite,
    aten,
    count,
    exported,
    program_of,
    program_outputs,
    run_pass,
)

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")

POOLS_1D = (aten.avg_pool1d.default, aten.max_pool1d.default, aten.adaptive_avg_pool1d.default)

CASES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[int, ...]]] = {
    "avg": (lambda x: F.avg_pool1d(x, 2, 2), (2, 8, 16)),
    "avg-padding-counted": (lambda x: F.avg_pool1d(x, 3, 2, 1), (2, 8, 17)),
    "avg-padding-not-counted": (
        lambda x: F.avg_pool1d(x, 3, 1, 1, count_include_pad=False),
        (1, 8, 9),
    ),
    "avg-unbatched": (lambda x: F.avg_pool1d(x, 4), (8, 16)),
    "max-dilated-ceil": (lambda x: F.max_pool1d(x, 3, 2, 1, 2, ceil_mode=True), (1, 8, 16)),
    "max-default-stride": (lambda x: F.max_pool1d(x, 2), (2, 4, 10)),
    "adaptive": (lambda x: F.adaptive_avg_pool1d(x, 4), (1, 8, 16)),
    "adaptive-to-1": (lambda x: F.adaptive_avg_pool1d(x, 1), (2, 8, 16)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_1d_pooling_becomes_the_2d_pooling_eager_computes_bit_for_bit(case: str) -> None:
    """ATen's 1-D poolings are its 2-D ones of ``unsqueeze(-2)``: equal bits, NaN and the
    infinities in the same places."""
    fn, sizes = CASES[case]
    torch.manual_seed(0)
    model, x = Apply(fn).eval(), torch.randn(sizes)
    x[..., 0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    gm, record = run_pass(Pool1dAsPool2d(), exported(model, x), x)
    assert record.rewrites == 1
    assert sum(count(gm, pool) for pool in POOLS_1D) == 0
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert got.shape == expected.shape
    assert_same_nonfinite(expected, got, atol=0, rtol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_the_program_is_one_delegate_call_and_computes_what_eager_does(case: str) -> None:
    """ExecuTorch's lowering wraps each 1-D pooling in an ``unsqueeze_copy`` and a
    ``squeeze_copy`` XNNPACK declines (and fails on an unbatched one, whose 2-D pooling is 3-D);
    after the export passes there is one delegate call."""
    fn, sizes = CASES[case]
    torch.manual_seed(0)
    model, x = Apply(lambda x: fn(x.relu()) * 2).eval(), torch.randn(sizes)
    if len(sizes) == 2:  # ExecuTorch 1.5.1 cannot lower an unbatched 1-D pooling at all
        with pytest.raises(LoweringError, match="ChannelsLastTaggedReshapePass"):
            program_of(exported(model, x), x)
    else:
        before = program_of(exported(model, x), x)
        copies = {"aten.squeeze_copy.dims", "aten.unsqueeze_copy"}
        assert copies <= {p.op for p in before.portable_ops}
    gm = exported(model, x)
    for p in export_pipeline():
        gm, _ = run_pass(p, gm, x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())
    with torch.no_grad():
        assert torch.allclose(program_outputs(gm, x), model(x), rtol=1e-6, atol=1e-6)
