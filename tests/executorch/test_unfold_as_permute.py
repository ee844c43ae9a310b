"""``unfold_as_permute``: ``F.unfold`` into tiles as a reshape, a permute and a reshape."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from fxmobile.executorch.passes.unfold_as_permute import UnfoldAsPermute
from tests.export_helpers import (
    Apply,
    aten,
    count,
    exported,
    program_of,
    program_outputs,
    run_pass,
)

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")

TILES: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "square": (dict(kernel_size=4, stride=4), (1, 3, 16, 16)),
    "oblong-padded-cropped": (
        dict(kernel_size=(3, 2), stride=(3, 2), padding=(1, 0)),
        (2, 3, 11, 9),
    ),
    "unbatched": (dict(kernel_size=2, stride=2), (3, 8, 6)),
}


@pytest.mark.parametrize("case", list(TILES))
def test_tiles_are_moved_into_the_columns_eager_puts_them_in(case: str) -> None:
    """Only elements move: every value, NaN and the infinities included, lands where eager's
    ``im2col`` puts it."""
    options, sizes = TILES[case]
    model, x = Apply(lambda x: F.unfold(x, **options)).eval(), torch.randn(sizes)
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    gm, record = run_pass(UnfoldAsPermute(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.im2col.default) == 0
    with torch.no_grad():
        expected, got = model(x), gm(x)
    assert got.shape == expected.shape
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())


def test_tnt_pixel_embedding_is_one_delegate_call() -> None:
    """TNT embeds pixels with a convolution and ``nn.Unfold(kernel_size=4, stride=4)``;
    ExecuTorch decomposes the unfold into a gather and index arithmetic on portable kernels."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1).eval()
    model = Apply(lambda x: F.unfold(conv(x), kernel_size=4, stride=4).transpose(1, 2)).eval()
    x = torch.randn(1, 3, 16, 16)
    before = program_of(exported(model, x), x)
    assert "aten.index.Tensor" in {p.op for p in before.portable_ops}
    gm, _ = run_pass(UnfoldAsPermute(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())
    with torch.no_grad():
        assert torch.allclose(program_outputs(gm, x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "options",
    [dict(kernel_size=3, stride=1), dict(kernel_size=2, stride=2, dilation=2)],
    ids=["overlapping", "dilated"],
)
def test_windows_that_overlap_or_skip_are_left_alone_with_the_reason(
    options: dict[str, int],
) -> None:
    model, x = Apply(lambda x: F.unfold(x, **options)).eval(), torch.randn(1, 2, 8, 8)
    gm, record = run_pass(UnfoldAsPermute(), exported(model, x), x)
    assert record.rewrites == 0
    assert record.skips == {"windows overlap or skip elements (XNNPACK has no gather)": 1}
    assert count(gm, aten.im2col.default) == 1
