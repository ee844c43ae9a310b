"""``fold_affine_into``, the one fold every BatchNorm and arithmetic fold into a module ends in:
what it refuses (a programming error inside fxmobile, so a plain TypeError / ValueError) and what
the new module keeps of the old one."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from fxmobile.passes.affine_fold import fold_affine_into, scale_output_channels

N = 4


def _affine() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    scale = torch.rand(N, generator=gen, dtype=torch.float64) + 0.5
    shift = torch.randn(N, generator=gen, dtype=torch.float64)
    return scale, shift


@pytest.mark.parametrize(
    "module",
    [nn.Conv2d(3, N, 3), nn.ConvTranspose2d(2, N, 3, groups=2), nn.Linear(3, N, bias=False)],
    ids=["conv", "grouped_transposed", "linear_without_bias"],
)
@pytest.mark.parametrize("requires_grad", [True, False])
def test_the_folded_module_computes_the_affine_map_and_keeps_requires_grad(
    module: nn.Module, requires_grad: bool
) -> None:
    """A frozen layer (``requires_grad_(False)``) stays frozen once folded: the REQUIRES_GRAD
    lint and a user's optimizer see the same flags as before."""
    module.requires_grad_(requires_grad)
    scale, shift = _affine()
    folded = fold_affine_into(module, scale, shift)
    assert folded is not module
    assert folded.weight.requires_grad is requires_grad
    assert folded.bias.requires_grad is requires_grad
    x = torch.randn(2, 3, 5, 5) if not isinstance(module, nn.Linear) else torch.randn(2, 3)
    if isinstance(module, nn.ConvTranspose2d):
        x = torch.randn(2, 2, 5, 5)
    with torch.no_grad():
        y = module.double()(x.double())
        expected = y * scale.reshape(-1, *[1] * (y.dim() - 2)) + shift.reshape(
            -1, *[1] * (y.dim() - 2)
        )
        got = folded.double()(x.double())
    torch.testing.assert_close(got, expected)


def test_a_module_that_is_not_a_conv_or_linear_is_a_type_error_naming_it() -> None:
    scale, shift = _affine()
    with pytest.raises(TypeError, match="cannot fold an affine map into BatchNorm2d"):
        fold_affine_into(nn.BatchNorm2d(N), scale, shift)


@pytest.mark.parametrize("wrong", ["scale", "shift"])
def test_a_scale_or_shift_of_another_length_is_a_value_error_naming_both(wrong: str) -> None:
    scale, shift = _affine()
    if wrong == "scale":
        scale = scale[:-1]
    else:
        shift = shift[:-1]
    got = re.escape(f"{tuple(scale.shape)}/{tuple(shift.shape)}")
    with pytest.raises(ValueError, match=f"must have {N} entries, got {got}"):
        fold_affine_into(nn.Conv2d(3, N, 1), scale, shift)


@pytest.mark.parametrize(
    ("shape", "transposed", "groups"),
    [
        ((2048, 512, 1, 1), False, 1),  # 4 blocks of 512 rows
        ((3000, 700), False, 1),  # a Linear: blocks of 374 rows, the last one short
        ((1024, 96, 3, 3), True, 4),  # transposed, grouped: groups span blocks
        ((8, 3, 5, 5), True, 2),  # one block
        ((1, 3, 3, 3), False, 1),  # one output channel: one row
        ((0, 3, 3, 3), False, 1),  # no output channels
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_scaling_in_blocks_is_the_float64_product_rounded_once(
    shape: tuple[int, ...], transposed: bool, groups: int, dtype: torch.dtype
) -> None:
    """Blocks of rows (to keep the float64 temporaries small) give every element exactly
    ``(W.double() * s).to(W.dtype)``, the one rounding the fold promises."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(shape, generator=gen).to(dtype)
    out_channels = shape[1] * groups if transposed else shape[0]
    scale = torch.rand(out_channels, generator=gen, dtype=torch.float64) * 3 - 1
    if transposed:
        w = weight.double().reshape(groups, shape[0] // groups, shape[1], *shape[2:])
        s = scale.reshape(groups, 1, shape[1], *([1] * (len(shape) - 2)))
        expected = (w * s).reshape(shape).to(dtype)
    else:
        expected = (weight.double() * scale.reshape(-1, *([1] * (len(shape) - 1)))).to(dtype)
    before = weight.clone()
    got = scale_output_channels(weight, scale, transposed=transposed, groups=groups)
    assert got.dtype == dtype and got.is_contiguous()
    assert torch.equal(got, expected)
    assert torch.equal(weight, before)  # the weight itself is never written
