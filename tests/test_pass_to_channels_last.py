"""ToChannelsLast: 4-D inputs and conv weights go NHWC; values and output strides do not change."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from fxmobile.infra import PassResult
from fxmobile.passes.stage import FxContext
from fxmobile.passes.to_channels_last import (
    BREAKS,
    NO_SHAPES,
    STRIDES,
    UNCHECKED,
    ToChannelsLast,
)
from tests.helpers import (
    assert_equivalent,
    count_calls,
    count_modules,
    randomize_batchnorm,
    run_fx_passes,
)

CL = torch.channels_last


def _run(model: nn.Module, *inputs: torch.Tensor) -> tuple[fx.GraphModule, PassResult]:
    gm = fx.symbolic_trace(copy.deepcopy(model))
    if inputs:
        ShapeProp(gm).propagate(*inputs)
    result = ToChannelsLast().call(gm, FxContext())
    gm.graph.lint()
    gm.recompile()
    return gm, result


def _entries(gm: fx.GraphModule) -> int:
    """Inserted ``x.contiguous(memory_format=torch.channels_last)`` nodes."""
    return sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_method"
        and n.target == "contiguous"
        and n.kwargs.get("memory_format") is CL
    )


def _weight(gm: nn.Module, path: str) -> torch.Tensor:
    return gm.get_parameter(f"{path}.weight")


def _restores(gm: fx.GraphModule) -> int:
    """Inserted plain ``y.contiguous()`` nodes (before the output)."""
    return count_calls(gm, "contiguous") - _entries(gm)


class ConvNet(nn.Module):
    def __init__(self, kind: type[nn.Module], groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = kind(8, 8, 3, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.bn(self.conv1(x))))


@pytest.mark.parametrize("kind", [nn.Conv2d, nn.ConvTranspose2d])
@pytest.mark.parametrize("groups", [1, 2])
def test_input_and_conv_weights_go_channels_last(kind: type[nn.Module], groups: int) -> None:
    torch.manual_seed(0)
    model = randomize_batchnorm(ConvNet(kind, groups)).eval()
    x = torch.randn(2, 3, 10, 12)
    gm, result = _run(model, x)
    assert _entries(gm) == 1 and _restores(gm) == 1
    assert count_modules(gm, nn.Conv2d) + count_modules(gm, kind) >= 2
    # 1 entry + 2 weights + 1 output restore
    assert result.rewrites == 4 and result.skips == {}
    for path in ("conv1", "conv2"):
        weight = _weight(gm, path)
        assert isinstance(weight, nn.Parameter) and weight.requires_grad
        assert weight.is_contiguous(memory_format=CL)
        assert not weight.is_contiguous()
    assert_equivalent(model, gm, x)
    out = gm(x)
    assert out.is_contiguous()  # strides as in eager


def test_new_parameters_leave_the_old_ones_and_keep_ties() -> None:
    conv = nn.Conv2d(4, 4, 3, padding=1)
    model = nn.Sequential(conv, nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1)).eval()
    tied = model[2]
    assert isinstance(tied, nn.Conv2d)
    tied.weight = conv.weight
    x = torch.randn(1, 4, 6, 6)
    gm = fx.symbolic_trace(model)  # shares the modules: the pass must not write to `conv.weight`
    old = conv.weight
    ShapeProp(gm).propagate(x)
    result = ToChannelsLast().call(gm, FxContext())
    gm.recompile()
    assert result.rewrites == 1 + 1 + 1  # entry, the one (tied) weight, output restore
    new = _weight(gm, "0")
    assert new is not old and old.is_contiguous()  # old tensor untouched
    assert _weight(gm, "2") is new  # still tied
    assert new.is_contiguous(memory_format=CL)


class WithConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pos = nn.Parameter(torch.randn(1, 4, 8, 8))
        self.register_buffer("gain", torch.rand(1, 4, 8, 8) + 0.5)
        self.w = nn.Parameter(torch.randn(4, 4, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x) + self.pos
        return F.conv2d(y * self.gain, self.w, padding=1)


class _BufferTracer(fx.Tracer):
    proxy_buffer_attributes = True


def test_constants_in_arithmetic_and_functional_conv_weights() -> None:
    torch.manual_seed(0)
    model = WithConstant().eval()
    x = torch.randn(2, 3, 8, 8)
    copied = copy.deepcopy(model)
    gm = fx.GraphModule(copied, _BufferTracer().trace(copied))
    ShapeProp(gm).propagate(x)
    result = ToChannelsLast().call(gm, FxContext())
    gm.recompile()
    assert _entries(gm) == 1
    # entry + conv.weight + pos + gain + w + output restore
    assert result.rewrites == 6
    for name in ("conv.weight", "pos", "gain", "w"):
        t = gm.get_parameter(name) if name != "gain" else gm.get_buffer(name)
        assert t.is_contiguous(memory_format=CL), name
        # the new tensor is registered as the old one was (TorchScript and state_dict read there)
        assert gm.state_dict(keep_vars=True)[name] is t, name
    assert isinstance(gm.get_parameter("pos"), nn.Parameter)
    assert_equivalent(model, gm, x)


class PlainTensorWeight(nn.Module):
    """A functional conv's weight kept as a plain tensor attribute (neither parameter nor
    buffer) of a module the graph also calls: the graph module shares that module, so the
    attribute stays plain there."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.conv.k = torch.randn(4, 4, 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(self.conv(x), self.conv.k, padding=1)


def test_a_plain_tensor_attribute_goes_channels_last_in_place_of_the_old() -> None:
    torch.manual_seed(0)
    model = PlainTensorWeight().eval()
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(model, x)
    assert result.rewrites == 4  # entry + conv.weight + conv.k + output restore
    conv = gm.get_submodule("conv")
    assert "k" in vars(conv) and conv.k.is_contiguous(memory_format=CL)
    assert model.conv.k.is_contiguous()
    with torch.no_grad():  # float32 only: .double() leaves a plain tensor attribute as it is
        torch.testing.assert_close(gm(x), model(x))


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        (nn.Linear(5, 3), (2, 5)),
        (nn.Conv1d(3, 4, 3), (2, 3, 9)),
        (nn.Conv3d(3, 4, 3), (1, 3, 5, 5, 5)),
    ],
)
def test_inputs_that_are_not_4d_untouched(model: nn.Module, shape: tuple[int, ...]) -> None:
    model.eval()
    x = torch.randn(*shape)
    gm, result = _run(model, x)
    assert result.rewrites == 0 and not result.modified
    assert result.skips == {"input is not a 4-D tensor": 1}
    assert count_calls(gm, "contiguous") == 0
    assert model.get_parameter("weight").is_contiguous()


class NoConv(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-1, -2), -1)


def test_4d_input_that_reaches_no_conv_untouched() -> None:
    q, k = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    gm, result = _run(NoConv(), q, k)
    assert result.rewrites == 0
    assert result.skips == {"4-D input reaches no 2-D conv (nothing to gain)": 2}
    assert count_calls(gm, "contiguous") == 0


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(6, 4)

    def forward(
        self, image: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv(image).mean((2, 3)) + self.fc(features), image


def test_only_the_4d_input_is_converted() -> None:
    model = TwoInputs().eval()
    image, features = torch.randn(2, 3, 8, 8), torch.randn(2, 6)
    gm, result = _run(model, image, features)
    assert _entries(gm) == 1
    (entry,) = [n for n in gm.graph.nodes if n.kwargs.get("memory_format") is CL]
    assert entry.args[0].target == "image"
    assert result.skips == {"input is not a 4-D tensor": 1}
    assert _weight(gm, "fc").is_contiguous()
    assert_equivalent(model, gm, image, features)
    assert gm(image, features)[1] is image  # returned as is, as eager does


def test_without_example_inputs_skips_with_reason() -> None:
    model = ConvNet(nn.Conv2d, 1).eval()
    gm, result = _run(model)
    assert result.rewrites == 0 and not result.modified
    assert result.skips == {NO_SHAPES: 1}
    assert count_calls(gm, "contiguous") == 0
    assert _weight(gm, "conv1").is_contiguous()


class ViewsAfterConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y.view(y.size(0), -1)  # needs contiguous memory: fails on NHWC


def test_view_that_would_break_declines_and_undoes_everything() -> None:
    model = ViewsAfterConv().eval()
    x = torch.randn(2, 3, 8, 8)
    gm = fx.symbolic_trace(copy.deepcopy(model))
    ShapeProp(gm).propagate(x)
    code, weight = gm.code, _weight(gm, "conv")
    result = ToChannelsLast().call(gm, FxContext())
    gm.graph.lint()
    gm.recompile()
    assert result.rewrites == 0 and result.skips == {BREAKS: 1}
    assert gm.code == code and _weight(gm, "conv") is weight
    assert torch.equal(gm(x), model(x))


class ReadsStrides(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, object]:
        y = self.conv(x)
        return y, y.is_contiguous()


def test_stride_reading_op_declines() -> None:
    model = ReadsStrides().eval()
    gm, result = _run(model, torch.randn(1, 3, 8, 8))
    assert result.rewrites == 0 and result.skips == {STRIDES: 1}
    assert count_calls(gm, "contiguous") == 0


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y / y.abs().max().item()  # .item() has no value on fake tensors


def test_graph_that_cannot_be_checked_is_left_alone() -> None:
    model = DataDependent().eval()
    x = torch.randn(1, 3, 8, 8)
    gm = fx.symbolic_trace(copy.deepcopy(model))
    ShapeProp(gm).propagate(x)
    code = gm.code
    result = ToChannelsLast().call(gm, FxContext())
    gm.recompile()
    assert result.rewrites == 0 and result.skips == {UNCHECKED: 1}
    assert gm.code == code and _weight(gm, "conv").is_contiguous()
    assert torch.equal(gm(x), model(x))


def test_end_to_end_through_the_pass_manager() -> None:
    torch.manual_seed(0)
    model = randomize_batchnorm(ConvNet(nn.Conv2d, 2)).eval()
    x = torch.randn(1, 3, 16, 16)
    gm = fx.symbolic_trace(copy.deepcopy(model))
    gm, records = run_fx_passes(gm, [ToChannelsLast()], (x,))
    (record,) = records
    assert record.rewrites == 4 and record.skips == {}
    assert record.param_bytes_after == record.param_bytes_before
    assert _entries(gm) == 1
    assert_equivalent(model, gm, x)
    for _ in range(2):  # runs more than once, same values (pytorch/pytorch#52463)
        assert_equivalent(model, gm, x)
