"""insert_prepacked_ops: linear and 2-D convolutions as a backend's prepack + run pairs.

    aten::linear(x, W, b)            -> run(x, prepack(W, b, None, None))
    aten::conv2d(x, W, b, s, p, d, g) -> run(x, prepack(W, b, s, p, d, g, None, None))
    aten::conv_transpose2d(x, W, b, s, p, op, g, d)
                                     -> run(x, prepack(W, b, s, p, op, d, g, None, None))

Both tables the pass is built with, XNNPACK's (``prepacked::*``) and Metal's
(``metal_prepack::*``, no transposed conv): counts of the aten kinds (gone) and of the prepack
and run kinds (there), the prepack calls' arguments, numerics against a float64 eager reference
(the prepack ops run on every call here: nothing is folded yet), and what has no prepacked form
and stays, with its reason.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.backends.library import OpFamily, ensure_registered
from fxmobile.backends.metal.pipeline import PREPACK as METAL
from fxmobile.backends.xnnpack.pipeline import PREPACK as XNNPACK
from fxmobile.options import MobileOptimizerType
from fxmobile.script.insert_prepacked_ops import InsertPrepackedOps
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.models import DynamicWeight
from tests.script.common import CTX, frozen, kinds, nodes_of


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    ensure_registered(OpFamily.XNNPACK)
    ensure_registered(OpFamily.METAL)


def xnnpack() -> InsertPrepackedOps:
    return InsertPrepackedOps(XNNPACK, MobileOptimizerType.INSERT_FOLD_PREPACK_OPS)


def metal() -> InsertPrepackedOps:
    return InsertPrepackedOps(METAL, None)


class Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, stride=2, padding=1, dilation=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=(2, 1), dilation=(2, 1), groups=8, bias=False)
        # groups and dilation both above 1: the prepack call takes them in the other order
        self.up = nn.ConvTranspose2d(
            8, 4, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=2
        )
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(self.dw(self.conv(x)))
        return self.fc(y.mean((2, 3)))


def test_xnnpack_table_rewrites_linear_conv2d_and_conv_transpose2d() -> None:
    model = Layers().eval()
    result = xnnpack().call(frozen(model), CTX)
    assert result.rewrites == 4 and result.skips == {}
    after = kinds(result.unit)
    assert not {"aten::linear", "aten::conv2d", "aten::conv_transpose2d"} & set(after)
    assert after["prepacked::conv2d_clamp_prepack"] == after["prepacked::conv2d_clamp_run"] == 2
    assert after["prepacked::conv2d_transpose_clamp_prepack"] == 1
    assert after["prepacked::conv2d_transpose_clamp_run"] == 1
    assert after["prepacked::linear_clamp_prepack"] == after["prepacked::linear_clamp_run"] == 1
    assert_equivalent(model, result.unit, torch.randn(2, 4, 16, 16))


def test_prepack_calls_take_the_layer_arguments_in_their_order_and_no_bounds() -> None:
    model = Layers().eval()
    result = xnnpack().call(frozen(model), CTX)
    (tconv,) = nodes_of(result.unit, "prepacked::conv2d_transpose_clamp_prepack")
    args = [v.toIValue() for v in list(tconv.inputs())[2:]]
    # stride, padding, output_padding, dilation, groups, min, max
    assert args == [[2, 2], [1, 1], [1, 1], [2, 2], 2, None, None]
    dw = nodes_of(result.unit, "prepacked::conv2d_clamp_prepack")[1]
    args = [v.toIValue() for v in list(dw.inputs())[1:]]
    # bias, stride, padding, dilation, groups, min, max
    assert args == [None, [1, 1], [2, 1], [2, 1], 8, None, None]
    (linear,) = nodes_of(result.unit, "prepacked::linear_clamp_prepack")
    assert [v.toIValue() for v in list(linear.inputs())[2:]] == [None, None]
    torch.testing.assert_close(linear.inputsAt(0).toIValue(), model.fc.weight, rtol=0, atol=0)
    (run,) = nodes_of(result.unit, "prepacked::linear_clamp_run")
    assert run.inputsAt(1).node() is linear


def test_metal_table_rewrites_linear_and_conv2d_only() -> None:
    model = Layers().eval()
    result = metal().call(frozen(model), CTX)
    assert result.rewrites == 3 and result.skips == {}
    after = kinds(result.unit)
    assert after["metal_prepack::conv2d_prepack"] == after["metal_prepack::conv2d_run"] == 2
    assert after["metal_prepack::linear_prepack"] == after["metal_prepack::linear_run"] == 1
    assert after["aten::conv_transpose2d"] == 1  # not in Metal's table: not a candidate
    assert not {"aten::linear", "aten::conv2d"} & set(after)
    (linear,) = nodes_of(result.unit, "metal_prepack::linear_prepack")
    # Metal's linear context takes the weight as nn.Linear holds it, (out, in)
    torch.testing.assert_close(linear.inputsAt(0).toIValue(), model.fc.weight, rtol=0, atol=0)
    assert_equivalent(model, result.unit, torch.randn(2, 4, 16, 16))


def test_prepack_kinds_name_what_prepack_folding_folds() -> None:
    assert xnnpack().prepack_kinds == {
        "prepacked::linear_clamp_prepack",
        "prepacked::conv2d_clamp_prepack",
        "prepacked::conv2d_transpose_clamp_prepack",
    }
    assert metal().prepack_kinds == {
        "metal_prepack::linear_prepack",
        "metal_prepack::conv2d_prepack",
    }


class WithExport(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)

    @torch.jit.export
    def twice(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.conv(x)[:, :3]) * 2


@pytest.mark.parametrize("insert", [xnnpack, metal], ids=["xnnpack", "metal"])
def test_every_rewritten_method_is_rewritten(insert: object) -> None:
    model = WithExport().eval()
    ctx = ScriptContext(("forward", "twice"), ("twice",))
    result = insert().call(frozen(model, ("twice",)), ctx)  # type: ignore[operator]
    assert result.rewrites == 3
    assert kinds(result.unit, "twice")["aten::conv2d"] == 0
    x = torch.randn(1, 3, 9, 9)
    assert_equivalent(model, result.unit, x)
    assert_equivalent(model.twice, result.unit.twice, x)


class SamePadding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding="same")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class VectorWeight(nn.Module):
    """``F.linear`` with a 1-D weight is a dot product: no linear context holds it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w)


LEFT_ALONE = {
    "string padding": (SamePadding(), (1, 3, 7, 7), "aten::conv2d",
                       "aten::conv2d with string padding"),
    "1-D linear weight": (VectorWeight(), (3, 4), "aten::linear", "aten::linear weight is 1-D"),
}  # fmt: skip


@pytest.mark.parametrize("insert", [xnnpack, metal], ids=["xnnpack", "metal"])
@pytest.mark.parametrize("name", list(LEFT_ALONE))
def test_what_has_no_prepacked_form_stays_with_its_reason(name: str, insert: object) -> None:
    model, shape, kind, reason = LEFT_ALONE[name]
    model = model.eval()
    result = insert().call(frozen(model), CTX)  # type: ignore[operator]
    assert result.rewrites == 0 and result.skips == {reason: 1}
    assert kinds(result.unit)[kind] == 1
    assert_equivalent(model, result.unit, torch.randn(shape))


def test_a_weight_of_unknown_rank_is_prepacked_on_every_call() -> None:
    model = DynamicWeight().eval()
    result = xnnpack().call(frozen(model), CTX)
    assert result.rewrites == 1
    assert_equivalent(model, result.unit, torch.randn(3, 4))


def test_the_rank_of_a_non_constant_weight_is_read_from_its_type() -> None:
    module = frozen(DynamicWeight().eval())
    (linear,) = nodes_of(module, "aten::linear")
    weight = linear.inputsAt(1)
    weight.setType(weight.type().with_sizes([20]))
    result = xnnpack().call(module, CTX)
    assert result.rewrites == 0 and result.skips == {"aten::linear weight is 1-D": 1}


class LeftAloneThenPrepacked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.same, self.vector = SamePadding(), VectorWeight()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.same(x).sum() + self.fc(self.vector(v)[:, None].expand(-1, 4))


def test_ops_left_alone_do_not_stop_the_rewrites_after_them() -> None:
    model = LeftAloneThenPrepacked().eval()
    result = xnnpack().call(frozen(model), CTX)
    assert result.rewrites == 1
    assert result.skips == {"aten::conv2d with string padding": 1, "aten::linear weight is 1-D": 1}
    assert_equivalent(model, result.unit, torch.randn(1, 3, 7, 7), torch.randn(3, 4))
