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
    HOOKED,
    NO_SHAPES,
    RESHAPED_WRITE,
    STRIDES,
    UNCHECKED,
    USERS_CODE,
    ToChannelsLast,
)
from tests.helpers import (
    assert_equivalent,
    count_calls,
    count_modules,
    randomize_batchnorm,
    run_fx_passes,
    trace_keeping,
)

CL = torch.channels_last


def user_scale(t: torch.Tensor) -> torch.Tensor:
    """A user's function, kept as one call by ``fx.wrap``: the pass cannot vouch that it takes
    any strides, so a graph that reaches it gets the fake-tensor check."""
    return t * 1.0


fx.wrap("user_scale")


class ScaledByUser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return user_scale(self.conv(x))


class UserStep(nn.Module):
    """A user's module (no standard leaf type): the pass cannot vouch for its forward."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape)  # .view of its own input's shape: any strides will do


def _run(
    model: nn.Module, *inputs: object, leaves: tuple[type[nn.Module], ...] = ()
) -> tuple[fx.GraphModule, PassResult]:
    """The pass on a copy of ``model`` traced with modules of ``leaves`` kept as calls."""
    gm = trace_keeping(copy.deepcopy(model), *leaves)
    if inputs:
        ShapeProp(gm).propagate(*inputs)
    result = ToChannelsLast().call(gm, FxContext(inputs or None))
    assert result.unit is gm  # rewritten in place, or declined: the same module either way
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
    result = ToChannelsLast().call(gm, FxContext((x,)))
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
    result = ToChannelsLast().call(gm, FxContext((x,)))
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
        return F.conv2d(self.conv(x), vars(self.conv)["k"], padding=1)


def test_a_plain_tensor_attribute_goes_channels_last_in_place_of_the_old() -> None:
    torch.manual_seed(0)
    model = PlainTensorWeight().eval()
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(model, x)
    assert result.rewrites == 4  # entry + conv.weight + conv.k + output restore
    k = vars(gm.get_submodule("conv"))["k"]  # still a plain attribute
    assert k.is_contiguous(memory_format=CL)
    assert vars(model.conv)["k"].is_contiguous()
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
    result = ToChannelsLast().call(gm, FxContext((x,)))
    assert result.unit is gm
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


def user_normalize(y: torch.Tensor) -> torch.Tensor:
    return y / y.abs().max().item()  # .item() has no value on fake tensors


fx.wrap("user_normalize")


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return user_normalize(self.conv(x))


class DataDependentAten(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y / y.abs().max().item()


class DataDependentFunctional(nn.Module):
    """As DataDependentAten, with the conv written as F.conv2d on a parameter: the change
    reaches the weight's get_attr too."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, self.weight)
        return y / y.abs().max().item()


@pytest.mark.parametrize("model_type", [DataDependentAten, DataDependentFunctional])
def test_ops_that_take_any_layout_are_converted_without_the_fake_run(
    model_type: type[nn.Module],
) -> None:
    """Every op the change reaches is an ATen op other than .view (``.item()`` included): the
    rewritten graph runs as the old one did, so the pass needs no fake run, which ``.item()``
    would fail (it has no value on fake tensors), and converts."""
    torch.manual_seed(0)
    model = model_type().eval()
    x = torch.randn(1, 3, 8, 8)
    gm, result = _run(model, x)
    assert result.rewrites == 3 and result.skips == {}  # entry, conv weight, output restore
    weight = gm.get_parameter("weight" if model_type is DataDependentFunctional else "conv.weight")
    assert _entries(gm) == 1 and weight.is_contiguous(memory_format=CL)
    assert_equivalent(model, gm, x)


class ThroughUserStep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.step = UserStep()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.step(self.conv(x))


@pytest.mark.parametrize("through", ["user function", "user module"])
def test_what_the_pass_cannot_vouch_for_is_run_on_fake_tensors(
    monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    """A user's function or a user's module kept as a leaf may call ``.view``: the rewritten
    graph is run on fake tensors, and converted when that run passes."""
    import fxmobile.passes.to_channels_last as pass_module

    runs: list[fx.GraphModule] = []
    check = pass_module._check

    def counted(gm: fx.GraphModule, example_inputs: tuple[object, ...]) -> str | None:
        runs.append(gm)
        return check(gm, example_inputs)

    monkeypatch.setattr(pass_module, "_check", counted)
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    model = ScaledByUser().eval() if through == "user function" else ThroughUserStep().eval()
    gm, result = _run(model, x, leaves=(UserStep,))
    assert len(runs) == 1 and result.rewrites == 3 and result.skips == {}
    assert_equivalent(model, gm, x)


def test_graph_that_cannot_be_checked_is_left_alone() -> None:
    model = DataDependent().eval()
    x = torch.randn(1, 3, 8, 8)
    gm = fx.symbolic_trace(copy.deepcopy(model))
    ShapeProp(gm).propagate(x)
    code = gm.code
    result = ToChannelsLast().call(gm, FxContext((x,)))
    assert result.unit is gm
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


def test_a_frozen_conv_weight_stays_frozen() -> None:
    """The new channels-last parameter keeps the old one's ``requires_grad``: a frozen backbone
    must not come back trainable."""
    model = ConvNet(nn.Conv2d, 1).eval()
    model.conv1.weight.requires_grad_(False)
    gm, result = _run(model, torch.randn(1, 3, 8, 8))
    assert result.rewrites == 4
    assert _weight(gm, "conv1").is_contiguous(memory_format=CL)
    assert not _weight(gm, "conv1").requires_grad
    assert _weight(gm, "conv2").requires_grad


class ArithmeticForms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pos, self.gain, self.shift, self.floor, self.ceil = (
            nn.Parameter(torch.randn(1, 4, 8, 8)) for _ in range(5)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x).add(self.pos).mul(self.gain)  # methods
        y = self.shift - y * torch.sigmoid(y)  # constant first; two activations
        return torch.minimum(y.maximum(self.floor), self.ceil)  # not arithmetic


def test_constants_of_every_arithmetic_form_go_channels_last_and_of_other_ops_do_not() -> None:
    """``y.add(c)`` / ``y.mul(c)`` (methods) and ``c - y`` (the constant first) are arithmetic
    as ``y + c`` is: their 4-D constants go channels-last. Arithmetic between two activations
    has no constant to convert. Only the four arithmetic ops are meant: the constants of
    ``y.maximum(c)`` and ``torch.minimum(y, c)`` are left as they were."""
    torch.manual_seed(0)
    model = ArithmeticForms().eval()
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(model, x)
    assert result.rewrites == 6  # entry + conv.weight + pos + gain + shift + output restore
    for name in ("pos", "gain", "shift"):
        assert gm.get_parameter(name).is_contiguous(memory_format=CL), name
    for name in ("floor", "ceil"):
        t = gm.get_parameter(name)
        assert t.is_contiguous() and not t.is_contiguous(memory_format=CL), name
    assert_equivalent(model, gm, x)


class StandardizedWeight(nn.Module):
    """timm's StdConv2d: the functional conv's weight is computed in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w - self.w.mean((1, 2, 3), keepdim=True)
        return F.conv2d(x, w, padding=1)


def test_a_conv_weight_computed_in_forward_is_left_as_it_is() -> None:
    """Only a stored weight (``get_attr``) can be stored channels-last; a computed one is
    passed over, the input is still converted."""
    torch.manual_seed(0)
    model = StandardizedWeight().eval()
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(model, x)
    assert result.rewrites == 2 and result.skips == {}  # entry + output restore
    assert _entries(gm) == 1
    assert gm.get_parameter("w").is_contiguous()
    assert_equivalent(model, gm, x)


class IgnoresAnInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, unused: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_an_unused_input_says_so() -> None:
    """Said unused, not that it reaches no conv; the other input is still converted."""
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(IgnoresAnInput().eval(), x, x.clone())
    assert result.rewrites == 3 and result.skips == {"input is unused": 1}
    assert _entries(gm) == 1


class TupleInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return user_scale(self.conv(x) * pair[0] + pair[1])  # user_scale: the check runs


def test_a_tuple_input_stays_as_it_is_and_the_rest_goes_channels_last() -> None:
    """A tuple of tensors is one input that is no tensor: it is left as it is. The check runs
    the graph on fake copies of the example inputs, the tuple's tensors too (it built inputs
    from tensor metadata before, and so declined the whole pass for any non-tensor input)."""
    torch.manual_seed(0)
    model = TupleInput().eval()
    x, pair = torch.randn(2, 3, 8, 8), (torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8))
    gm, result = _run(model, x, pair)
    assert result.skips == {"input is not a tensor": 1}
    assert result.rewrites == 3  # x's entry, the conv weight, the output back to eager's layout
    assert _entries(gm) == 1
    assert _weight(gm, "conv").is_contiguous(memory_format=torch.channels_last)
    assert_equivalent(model, gm, x, pair)


def test_shapes_from_another_propagation_without_example_inputs_change_nothing() -> None:
    """The layout check runs the example inputs; a caller that propagated shapes itself and
    passes none gets the graph back as it was."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    gm = fx.symbolic_trace(copy.deepcopy(model))
    ShapeProp(gm).propagate(x)
    code = gm.code
    result = ToChannelsLast().call(gm, FxContext())
    gm.recompile()
    assert (result.rewrites, result.skips) == (0, {NO_SHAPES: 1})
    assert gm.code == code and _weight(gm, "0").is_contiguous()


class WritesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        x.mul_(2)  # the caller's tensor
        return y


def test_an_input_written_in_place_stays_the_callers_tensor() -> None:
    """A converted input is a copy: the forward's write would land on it and no longer reach
    the caller's tensor. Such an input is left as it is."""
    torch.manual_seed(0)
    model = WritesItsInput().eval()
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(model, x.clone())
    assert result.rewrites == 0
    assert result.skips == {"input is written in place by forward": 1}
    eager_x, got_x = x.clone(), x.clone()
    with torch.no_grad():
        torch.testing.assert_close(gm(got_x), model(eager_x))
    assert torch.equal(got_x, eager_x) and torch.equal(got_x, x * 2)


class ConstantAlsoReturned(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.conv2d(x, weight=self.w, padding=1), self.w * 2  # weight by keyword


class SharedConv(nn.Module):
    """One conv called on the converted input and on a value the input does not reach (``z``
    is 3-D: not converted). Its new weight makes the second call's output channels-last too."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(8, 2)

    def forward(
        self, x: torch.Tensor, z: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.conv(x), self.conv(z.unsqueeze(0)), self.head(z)


@pytest.mark.parametrize(
    ("model", "inputs", "restores", "skips"),
    [
        (ConstantAlsoReturned(), (torch.randn(2, 3, 8, 8),), 2, {}),
        (
            SharedConv(),
            (torch.randn(2, 3, 8, 8), torch.randn(3, 8, 8)),
            2,
            {"input is not a 4-D tensor": 1},
        ),
    ],
    ids=["constant_read_again", "conv_called_again"],
)
def test_values_a_converted_tensor_reaches_keep_eager_output_strides(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], restores: int, skips: dict[str, int]
) -> None:
    """The layout change spreads from converted tensors too, not only from the input: a
    converted constant read again (``w * 2``) and a conv whose new weight serves a call the input
    does not reach both give channels-last values. Those outputs are restored to eager's
    contiguous strides; an output nothing converted reaches (``head(z)``) is left alone."""
    torch.manual_seed(0)
    model.eval()
    gm, result = _run(model, *inputs)
    assert _restores(gm) == restores
    assert result.rewrites == 1 + 1 + restores  # entry + the weight + restores
    assert result.skips == skips
    for i, out in enumerate(gm(*inputs)):
        assert out.is_contiguous(), i
    assert_equivalent(model, gm, *inputs)


class ReadsConstantStrides(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
        return F.conv2d(x, self.w, padding=1), self.w.is_contiguous()


class ReadsSharedConvStrides(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, bool]:
        return self.conv(x), self.conv(z.unsqueeze(0)).is_contiguous()


@pytest.mark.parametrize(
    ("model", "inputs", "skips"),
    [
        (ReadsConstantStrides(), (torch.randn(2, 3, 8, 8),), {STRIDES: 1}),
        (
            ReadsSharedConvStrides(),
            (torch.randn(2, 3, 8, 8), torch.randn(3, 8, 8)),
            {"input is not a 4-D tensor": 1, STRIDES: 1},
        ),
    ],
    ids=["constant", "conv_called_again"],
)
def test_stride_reads_on_values_only_a_converted_tensor_reaches_decline(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], skips: dict[str, int]
) -> None:
    """A stride read downstream of a converted weight, not of the input, would change its
    answer (``is_contiguous()`` True in eager, False once the weight is channels-last): the
    pass declines."""
    model.eval()
    gm, result = _run(model, *inputs)
    assert result.rewrites == 0 and result.skips == skips
    assert count_calls(gm, "contiguous") == 0
    assert gm(*inputs)[1] is True


class WritesThroughFlattenModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.flatten = nn.Flatten()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        self.flatten(y).mul_(2)  # a view of y in NCHW: doubles y; a copy once channels-last
        return y


def test_a_write_through_an_nn_flatten_module_declines() -> None:
    """``nn.Flatten`` is ``torch.flatten``: a view of an NCHW tensor, a copy of a channels-last
    one, so the write would stop reaching ``y`` (the module would return y, not 2 * y)."""
    torch.manual_seed(0)
    model = WritesThroughFlattenModule().eval()
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(model, x)
    assert result.rewrites == 0 and result.skips == {RESHAPED_WRITE: 1}
    assert count_calls(gm, "contiguous") == 0
    assert_equivalent(model, gm, x)


class SeveralOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[object, ...]:
        y = self.conv(x)
        return y.size(1), y.mean((1, 2, 3)), y.permute(0, 2, 3, 1), y[0, 0], y


def test_only_outputs_eager_returned_contiguous_with_two_dims_or_more_are_restored() -> None:
    """Every output is looked at, whatever comes before it: an int (``size``), a 1-D tensor
    (always contiguous), an output eager itself returned non-contiguous (``permute``) get
    nothing; a 2-D channel map (``y[0, 0]``: strided once y is channels-last) and the 4-D map
    get ``.contiguous()``."""
    torch.manual_seed(0)
    model = SeveralOutputs().eval()
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(model, x)
    assert _restores(gm) == 2
    assert result.rewrites == 4  # entry + conv.weight + 2 restores
    out = gm(x)
    assert out[3].is_contiguous() and out[4].is_contiguous()
    assert_equivalent(model, gm, x)


def test_a_float64_model_is_checked_with_float64_inputs() -> None:
    """The fake-tensor check builds inputs of the example inputs' dtype: float32 stand-ins
    would fail against float64 weights and the pass would decline a model it handles."""
    torch.manual_seed(0)
    model = ScaledByUser().double().eval()  # user_scale: the check runs
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    gm, result = _run(model, x)
    assert result.rewrites == 3 and result.skips == {}
    assert _weight(gm, "conv").dtype == torch.float64
    assert _weight(gm, "conv").is_contiguous(memory_format=CL)
    assert_equivalent(model, gm, x)


class ScaledConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return user_scale(self.conv(x) * scale)  # user_scale: the check runs


def test_a_parameter_left_to_its_default_value_is_checked_with_it() -> None:
    """``forward(x, scale=2.0)`` called with ``x`` only: the check runs the graph with the
    default, as the caller's call will."""
    torch.manual_seed(0)
    model = ScaledConv().eval()
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(model, x)
    assert result.rewrites == 3  # entry + conv.weight + output restore
    assert result.skips == {"input is not a tensor": 1}
    assert_equivalent(model, gm, x)


class ScaleByMap(nn.Module):
    """A user's module kept as a leaf: its 4-D ``weight`` is no conv weight, and what its
    forward does with it is not seen by the pass."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, 4, 8, 8))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.weight


def test_the_weight_of_a_leaf_module_that_is_no_conv_is_left_alone() -> None:
    """Only ``nn.Conv2d`` / ``nn.ConvTranspose2d`` weights are stored channels-last: those are
    known to be read as conv weights only. A leaf module's ``weight`` keeps its layout."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), ScaleByMap()).eval()
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(model, x, leaves=(ScaleByMap,))
    assert count_modules(gm, ScaleByMap) == 1
    assert result.rewrites == 3 and result.skips == {}  # entry + conv weight + output restore
    assert _weight(gm, "0").is_contiguous(memory_format=CL)
    assert _weight(gm, "1").is_contiguous()
    assert_equivalent(model, gm, x)


def test_a_module_with_hooks_declines_and_its_hook_sees_eager_layout() -> None:
    """A hook kept on a module the change reaches would see channels-last tensors: the pass
    declines, and the hook sees what it saw in eager."""
    seen: list[bool] = []
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()).eval()
    model[1].register_forward_hook(lambda m, args, out: seen.append(out.is_contiguous()))
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(model, x)
    assert result.rewrites == 0 and result.skips == {HOOKED: 1}
    assert count_calls(gm, "contiguous") == 0 and _weight(gm, "0").is_contiguous()
    seen.clear()
    assert torch.equal(gm(x), model(x))
    assert seen == [True, True]


def user_branch(t: torch.Tensor) -> torch.Tensor:
    """A user's function that reads its input's layout where the graph cannot see it."""
    return t * 2 if t.is_contiguous() else t - 1


fx.wrap("user_branch")


class LayoutBranch(nn.Module):
    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t * 2 if t.is_contiguous() else t - 1


class BranchAfterConv(nn.Module):
    def __init__(self, through: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.branch = LayoutBranch()
        self.through = through

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.branch(y) if self.through == "user module" else user_branch(y)


@pytest.mark.parametrize("through", ["user module", "user function"])
def test_regression_the_users_code_that_reads_strides_declines(through: str) -> None:
    """F13: a leaf branching on ``is_contiguous()`` got the channels-last conv output and took
    the other branch; the fake-tensor check ran it without noticing (the gate then refused the
    model). Its layout comes from the caller's input, so no copy can restore it: declined."""
    model = BranchAfterConv(through).eval()
    x = torch.randn(2, 3, 8, 8)
    gm, result = _run(model, x, leaves=(LayoutBranch,))
    assert result.rewrites == 0 and result.skips == {USERS_CODE: 1}
    assert _entries(gm) == 0 and _weight(gm, "conv").is_contiguous()
    for given in (x, x.contiguous(memory_format=CL)):
        with torch.no_grad():
            assert torch.equal(gm(given), model(given))
