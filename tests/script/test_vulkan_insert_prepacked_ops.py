"""insert_prepacked_ops (Vulkan): ATen layers as ``create_*_context`` + ``run_*_context`` pairs.

Counts of each aten kind (gone) and of its create and run kinds (there), the create calls'
arguments (the linear's weight transposed once, the transposed conv's argument order, the
conv's empty bounds), numerics against a float64 eager reference (fxmobile's kernels run the
Vulkan ops on the CPU; the create calls run on every call here, nothing is folded), and what
Vulkan cannot run, which stays ATen with its reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.backends.library import OpFamily, ensure_registered
from fxmobile.backends.vulkan.insert_prepacked_ops import CREATE_KINDS, RULES, InsertVulkanOps
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent, randomize_batchnorm
from tests.models import DynamicWeight, Recurrent
from tests.script.common import CTX, constant_tensor, frozen, kinds, nodes_of

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    ensure_registered(OpFamily.VULKAN)


class Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1d = nn.Conv1d(4, 6, 3, stride=2, padding=1)
        self.conv = nn.Conv2d(6, 8, 3, padding=1, groups=2)
        self.up = nn.ConvTranspose2d(
            8, 4, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=2
        )
        self.fc = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)
        self.ln = nn.LayerNorm(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1d(x).unsqueeze(2)
        y = self.up(self.conv(y)).mean((2, 3))
        return self.ln(self.bn(self.fc(y)))


PAIRS = {
    "aten::conv1d": "conv1d",
    "aten::conv2d": "conv2d",
    "aten::conv_transpose2d": "tconv2d",
    "aten::linear": "linear",
    "aten::batch_norm": "batchnorm",
    "aten::layer_norm": "layernorm",
}


def test_each_layer_becomes_a_create_run_pair() -> None:
    model = randomize_batchnorm(Layers()).eval()
    result = InsertVulkanOps().call(frozen(model), CTX)
    assert result.rewrites == 6 and result.skips == {}
    after = kinds(result.unit)
    for aten, name in PAIRS.items():
        assert after[aten] == 0, aten
        assert after[f"vulkan_prepack::create_{name}_context"] == 1, name
        assert after[f"vulkan_prepack::run_{name}_context"] == 1, name
    assert_equivalent(model, result.unit, torch.randn(2, 4, 9))


def test_create_calls_take_their_arguments_in_vulkans_order() -> None:
    model = Layers().eval()
    result = InsertVulkanOps().call(frozen(model), CTX)
    (linear,) = nodes_of(result.unit, "vulkan_prepack::create_linear_context")
    weight = constant_tensor(linear.inputsAt(0))
    assert weight.is_contiguous()
    torch.testing.assert_close(weight, model.fc.weight.t(), rtol=0, atol=0)  # (in, out)
    (tconv,) = nodes_of(result.unit, "vulkan_prepack::create_tconv2d_context")
    # stride, padding, output_padding, dilation, groups, min, max
    assert [v.toIValue() for v in list(tconv.inputs())[2:]] == [
        [2, 2], [1, 1], [1, 1], [2, 2], 2, None, None
    ]  # fmt: skip
    (conv,) = nodes_of(result.unit, "vulkan_prepack::create_conv2d_context")
    assert [v.toIValue() for v in list(conv.inputs())[2:]] == [
        [1, 1],
        [1, 1],
        [1, 1],
        2,
        None,
        None,
    ]
    (conv1d,) = nodes_of(result.unit, "vulkan_prepack::create_conv1d_context")
    assert conv1d.inputsSize() == 6  # no bounds: Vulkan's conv1d takes no clamp
    assert set(CREATE_KINDS) == {
        f"vulkan_prepack::create_{n}_context" for n in [*PAIRS.values(), "gru", "lstm"]
    }
    assert set(RULES) == {*PAIRS, "aten::gru", "aten::lstm"}


def test_a_non_constant_linear_weight_is_transposed_in_the_graph() -> None:
    model = DynamicWeight().eval()
    result = InsertVulkanOps().call(frozen(model), CTX)
    assert result.rewrites == 1
    (create,) = nodes_of(result.unit, "vulkan_prepack::create_linear_context")
    assert create.inputsAt(0).node().kind() == "aten::t"
    assert_equivalent(model, result.unit, torch.randn(3, 4))


def test_gru_and_lstm_become_create_run_pairs() -> None:
    torch.manual_seed(0)
    model = Recurrent().eval()
    result = InsertVulkanOps().call(frozen(model), CTX)
    assert result.rewrites == 2 and result.skips == {}
    after = kinds(result.unit)
    assert after["aten::gru"] == after["aten::lstm"] == 0
    assert (
        after["vulkan_prepack::run_gru_context"] == after["vulkan_prepack::run_lstm_context"] == 1
    )
    (run_lstm,) = nodes_of(result.unit, "vulkan_prepack::run_lstm_context")
    assert run_lstm.inputsSize() == 4  # x, h, c (unpacked from the list), the context
    inputs = (
        torch.randn(3, 5, 4),
        torch.randn(2, 3, 6),
        torch.randn(1, 3, 5),
        torch.randn(1, 3, 5),
    )
    assert_equivalent(model, result.unit, *inputs)


class Single(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


class TrainingFlag(nn.Module):
    if TYPE_CHECKING:  # buffers, for mypy; TorchScript cannot read string annotations
        mean: torch.Tensor
        var: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(5) + 0.5)
        self.b = nn.Parameter(torch.randn(5))
        self.register_buffer("mean", torch.randn(5))
        self.register_buffer("var", torch.rand(5) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        use_batch = bool(x.sum() > 1e9)  # False, but not a constant
        return F.batch_norm(x, self.mean, self.var, self.w, self.b, use_batch)


class GruFlags(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 5, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = [self.gru.weight_ih_l0, self.gru.weight_hh_l0,
                  self.gru.bias_ih_l0, self.gru.bias_hh_l0]  # fmt: skip
        h = x.new_zeros(1, x.shape[0], 5)
        batch_first = bool(x.sum() < 1e9)  # True, but not a constant
        # GRU sets its weights by name at run time: torch's stubs type them Tensor | Module
        return torch.gru(x, h, params, True, 1, 0.0, False, False, batch_first)[0]  # type: ignore[arg-type]


LEFT_ALONE = {
    "string padding": (Single(nn.Conv2d(3, 4, 3, padding="same")), (1, 3, 6, 6), "aten::conv2d",
                       "aten::conv2d with string padding"),
    "string padding conv1d": (Single(nn.Conv1d(3, 4, 3, padding="same")), (1, 3, 6),
                              "aten::conv1d", "aten::conv1d with string padding"),
    "layer_norm without affine": (
        Single(nn.LayerNorm(5, elementwise_affine=False)), (2, 5), "aten::layer_norm",
        "aten::layer_norm without weight and bias (Vulkan needs elementwise_affine=True)"),
    "batch_norm without running stats": (
        Single(nn.BatchNorm1d(5, track_running_stats=False)), (4, 5), "aten::batch_norm",
        "aten::batch_norm uses batch statistics (training mode or no running stats)"),
    "batch_norm without affine": (
        Single(nn.BatchNorm1d(5, affine=False)), (4, 5), "aten::batch_norm",
        "aten::batch_norm without weight and bias (Vulkan needs affine=True)"),
    "batch_norm training flag not constant": (
        TrainingFlag(), (4, 5), "aten::batch_norm",
        "aten::batch_norm with a non-constant training flag"),
    "gru not batch_first": (Single(nn.GRU(4, 5)), (3, 2, 4), "aten::gru",
                            "aten::gru without batch_first (Vulkan requires batch_first=True)"),
    "gru without biases": (Single(nn.GRU(4, 5, bias=False, batch_first=True)), (2, 3, 4),
                           "aten::gru", "aten::gru without biases"),
    "gru bidirectional": (Single(nn.GRU(4, 5, batch_first=True, bidirectional=True)), (2, 3, 4),
                          "aten::gru", "aten::gru bidirectional"),
    "gru with dropout": (Single(nn.GRU(4, 5, num_layers=2, dropout=0.5, batch_first=True)),
                         (2, 3, 4), "aten::gru", "aten::gru with dropout > 0"),
    "gru flags not constant": (GruFlags(), (2, 3, 4), "aten::gru",
                               "aten::gru with non-constant flags"),
    "lstm with projections": (Single(nn.LSTM(4, 5, proj_size=3, batch_first=True)), (2, 3, 4),
                              "aten::lstm", "aten::lstm with projections"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(LEFT_ALONE))
def test_what_vulkan_cannot_run_stays_aten_with_its_reason(name: str) -> None:
    model, shape, kind, reason = LEFT_ALONE[name]
    model = randomize_batchnorm(model).eval()
    result = InsertVulkanOps().call(frozen(model), CTX)
    assert result.rewrites == 0 and result.skips == {reason: 1}
    assert kinds(result.unit)[kind] == 1
    assert not [k for k in kinds(result.unit) if k.startswith("vulkan_prepack::")]
    assert_equivalent(model, result.unit, torch.randn(shape))


def test_gru_in_training_mode_stays() -> None:
    class TrainingGru(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = nn.GRU(4, 5, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            params = [self.gru.weight_ih_l0, self.gru.weight_hh_l0,
                      self.gru.bias_ih_l0, self.gru.bias_hh_l0]  # fmt: skip
            h = x.new_zeros(1, x.shape[0], 5)
            # GRU sets its weights by name at run time: torch's stubs type them Tensor | Module
            return torch.gru(x, h, params, True, 1, 0.0, True, False, True)[0]  # type: ignore[arg-type]

    model = TrainingGru().eval()
    result = InsertVulkanOps().call(frozen(model), CTX)
    assert result.rewrites == 0 and result.skips == {"aten::gru in training mode": 1}
    assert_equivalent(model, result.unit, torch.randn(2, 3, 4))


def test_every_rewritten_method_is_rewritten() -> None:
    class WithExport(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

        @torch.jit.export
        def twice(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.fc(x))

    model = WithExport().eval()
    ctx = ScriptContext(("forward", "twice"), ("twice",))
    result = InsertVulkanOps().call(frozen(model, ("twice",)), ctx)
    assert result.rewrites == 3
    x = torch.randn(2, 3)
    assert_equivalent(model.twice, result.unit.twice, x)
