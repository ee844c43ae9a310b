"""canonicalize_convolutions: the convolutions the backends prepack, in canonical form.

    _convolution(x, W, b, ..., transposed, ...)  ->  conv{N}d / conv_transpose{N}d
    conv{N}d(..., padding="same" / "valid", ...)  ->  conv{N}d(..., [p, ...], ...)

Counts of ``aten::_convolution`` (gone) and the canonical kinds, numerics against a float64 eager
reference, and a 'same' padding integer padding cannot say (an even kernel), left alone.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.script.canonicalize_convolutions import CanonicalizeConvolutions
from fxmobile.script.graph_utils import count_kinds, op_histogram
from tests.helpers import assert_equivalent
from tests.script.common import CTX as NO_INPUTS
from tests.script.common import frozen, nodes_of


def test_a_traced_convolution_becomes_an_aten_conv() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ConvTranspose2d(4, 2, 2, 2)).eval()
    x = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        traced = torch.jit.freeze(torch.jit.trace(model, x), optimize_numerics=False)
    assert count_kinds(traced, ["forward"], {"aten::_convolution"}) == 2
    result = CanonicalizeConvolutions().call(traced, NO_INPUTS)
    hist = op_histogram(result.unit, ["forward"])
    assert result.rewrites == 2
    assert (hist["aten::conv2d"], hist["aten::conv_transpose2d"]) == (1, 1)
    assert "aten::_convolution" not in hist
    assert_equivalent(model, result.unit, x)


class StringPadded(nn.Module):
    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


# conv -> (input shape, kind after, the integer padding it gets)
STRING_PADDED = {
    "same 3x3": (nn.Conv2d(3, 4, 3, padding="same"), (1, 3, 6, 6), "aten::conv2d", [1, 1]),
    "same 5x3, dilation 2": (
        nn.Conv2d(3, 4, (5, 3), padding="same", dilation=2), (1, 3, 9, 9), "aten::conv2d", [4, 2]
    ),
    "valid": (nn.Conv2d(3, 4, 3, padding="valid"), (1, 3, 6, 6), "aten::conv2d", [0, 0]),
    "same conv1d": (nn.Conv1d(3, 4, 5, padding="same"), (2, 3, 9), "aten::conv1d", [2]),
    "same conv3d": (nn.Conv3d(2, 3, 3, padding="same"), (1, 2, 4, 4, 4), "aten::conv3d", [1] * 3),
}  # fmt: skip


@pytest.mark.parametrize("name", list(STRING_PADDED))
def test_string_padding_becomes_integer_padding(name: str) -> None:
    conv, shape, kind, padding = STRING_PADDED[name]
    model = StringPadded(conv).eval()
    result = CanonicalizeConvolutions().call(frozen(model), NO_INPUTS)
    assert result.rewrites == 1 and result.skips == {}
    (node,) = nodes_of(result.unit, kind)
    assert node.inputsAt(4).toIValue() == padding
    assert_equivalent(model, result.unit, torch.randn(shape))


def test_asymmetric_same_padding_is_left_alone() -> None:
    # an even kernel pads 3 in total: torch puts the odd one at the end, integer padding cannot
    model = StringPadded(nn.Conv2d(3, 4, 4, padding="same")).eval()
    result = CanonicalizeConvolutions().call(frozen(model), NO_INPUTS)
    reason = "'same' padding of kernel [4, 4] is asymmetric (no integer padding says it)"
    assert result.rewrites == 0 and result.skips == {reason: 1}
    assert isinstance(nodes_of(result.unit, "aten::conv2d")[0].inputsAt(4).toIValue(), str)
    assert_equivalent(model, result.unit, torch.randn(1, 3, 6, 6))


def test_a_canonical_convolution_is_not_counted() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ConvTranspose2d(4, 2, 2)).eval()
    result = CanonicalizeConvolutions().call(frozen(model), NO_INPUTS)
    assert result.rewrites == 0 and not result.modified and result.skips == {}


def test_traced_1d_and_3d_convolutions_take_their_rank_from_the_weight() -> None:
    for model, shape, kind in (
        (nn.Conv1d(3, 4, 3, stride=2), (1, 3, 9), "aten::conv1d"),
        (nn.Conv3d(2, 3, 3, padding=1), (1, 2, 4, 4, 4), "aten::conv3d"),
        (nn.ConvTranspose1d(3, 2, 3, stride=2, output_padding=1), (1, 3, 5),
         "aten::conv_transpose1d"),
    ):  # fmt: skip
        model.eval()
        x = torch.randn(shape)
        with torch.no_grad():
            traced = torch.jit.freeze(torch.jit.trace(model, x), optimize_numerics=False)
        result = CanonicalizeConvolutions().call(traced, NO_INPUTS)
        assert result.rewrites == 1 and op_histogram(result.unit, ["forward"])[kind] == 1
        assert_equivalent(model, result.unit, x)


class OneDilationForTwoDims(nn.Module):
    """A one-element dilation list, which ATen expands to every spatial dim."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3, 3, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, None, [1], "same", [2])


def test_a_one_element_dilation_applies_to_every_dim() -> None:
    model = OneDilationForTwoDims().eval()
    result = CanonicalizeConvolutions().call(frozen(model), NO_INPUTS)
    assert result.rewrites == 1 and result.skips == {}
    (node,) = nodes_of(result.unit, "aten::conv2d")
    assert node.inputsAt(4).toIValue() == [2, 4]
    assert_equivalent(model, result.unit, torch.randn(1, 3, 8, 9))


class WeightFromTheCaller(nn.Module):
    """A conv whose weight is an input (not a constant, so nothing to canonicalize), then an
    asymmetric one (left alone), then one the pass rewrites."""

    def __init__(self) -> None:
        super().__init__()
        self.asymmetric = nn.Conv2d(4, 4, 4, padding="same")
        self.same = nn.Conv2d(4, 4, 3, padding="same")

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.same(self.asymmetric(F.conv2d(x, w, padding="same")))


def test_convolutions_left_alone_do_not_stop_the_rewrites_after_them() -> None:
    model = WeightFromTheCaller().eval()
    result = CanonicalizeConvolutions().call(frozen(model), NO_INPUTS)
    assert result.rewrites == 1
    assert result.skips == {
        "aten::conv2d weight is not a constant 3-5-D tensor": 1,
        "'same' padding of kernel [4, 4] is asymmetric (no integer padding says it)": 1,
    }
    assert_equivalent(model, result.unit, torch.randn(1, 3, 6, 6), torch.randn(4, 3, 3, 3))


class ArgumentsFromTheCaller(nn.Module):
    """A 'same' padded conv whose dilation the caller gives, and a traced-style convolution whose
    transposed flag the caller gives: neither form is known until the call."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x: torch.Tensor, dilation: list[int], transposed: bool) -> torch.Tensor:
        y = F.conv2d(x, self.w, None, 1, "same", dilation)
        z = torch._convolution(
            x, self.w, None, [1, 1], [1, 1], [1, 1], transposed, [0, 0], 1, False, False, True, True
        )
        return y + z


def test_convolutions_whose_form_the_caller_gives_are_left_alone() -> None:
    model = ArgumentsFromTheCaller().eval()
    result = CanonicalizeConvolutions().call(frozen(model), NO_INPUTS)
    assert result.rewrites == 0
    assert result.skips == {
        "aten::conv2d padding or dilation is not a constant": 1,
        "aten::_convolution transposed flag is not a constant": 1,
    }
    x = torch.randn(1, 3, 6, 6)
    torch.testing.assert_close(result.unit(x, [1, 1], False), model(x, [1, 1], False))
