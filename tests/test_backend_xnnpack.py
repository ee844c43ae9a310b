"""The CPU (XNNPACK) TorchScript stage: prepacked ops, clamp fusion, folding, end to end."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
import torch
import torch.jit.mobile
import torch.nn.functional as F
import torch.utils.bundled_inputs
import torchvision
from torch import nn

import fxmobile
from fxmobile import MobileOptimizerType
from fxmobile.backends.xnnpack.fuse_add_relu import FLOATING
from fxmobile.script.graph_utils import op_histogram
from fxmobile.script.jit_passes import jit
from fxmobile.script.quiet_script import quietly_script
from tests.helpers import assert_equivalent, randomize_batchnorm


def ops(module: torch.jit.ScriptModule) -> dict[str, int]:
    return dict(op_histogram(module, ["forward"]))


def cpu(model: nn.Module, x: torch.Tensor, **kwargs: object) -> fxmobile.MobileResult:
    return fxmobile.optimize(model, example_inputs=x, **kwargs)  # type: ignore[call-overload]


class Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8, bias=False)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(self.dw(self.conv(x)))
        return self.fc(y.mean((2, 3)))


def test_linear_and_convs_become_prepacked_runs_with_folded_contexts() -> None:
    model = Layers().eval()
    x = torch.randn(2, 3, 16, 16)
    result = cpu(model, x)
    hist = ops(result.module)
    assert hist["prepacked::conv2d_clamp_run"] == 2
    assert hist["prepacked::conv2d_transpose_clamp_run"] == 1
    assert hist["prepacked::linear_clamp_run"] == 1
    assert not {k for k in hist if k.endswith("_prepack") or k in ("aten::conv2d", "aten::linear")}
    assert result.report.record("insert_prepacked_ops").rewrites == 4
    assert result.report.record("fold_prepacking").rewrites == 4
    assert result.module._c.hasattr("prepack_folding_forward._jit_pass_packed_weight_0")
    assert_equivalent(model, result.module, x)


class Activated(nn.Module):
    def __init__(self, act: object) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.fc = nn.Linear(6, 6)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.conv(x))  # type: ignore[operator]
        return self.act(self.fc(y.mean((2, 3))))  # type: ignore[operator]


ACTIVATIONS = {
    "relu": (nn.ReLU(), (0.0, None)),
    "relu_": (nn.ReLU(inplace=True), (0.0, None)),
    "hardtanh": (nn.Hardtanh(-0.5, 0.25), (-0.5, 0.25)),
    "hardtanh_": (nn.Hardtanh(-0.5, 0.25, inplace=True), (-0.5, 0.25)),
    "relu6": (nn.ReLU6(), (0.0, 6.0)),
    "clamp": (lambda t: torch.clamp(t, -0.1, 0.2), (-0.1, 0.2)),
    "clamp_min": (lambda t: torch.clamp(t, min=0.05), (0.05, None)),
    "clamp_max": (lambda t: t.clamp(max=0.3), (None, 0.3)),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_clamping_activation_fuses_into_the_prepacked_op(name: str) -> None:
    act, bounds = ACTIVATIONS[name]
    model = Activated(act).eval()
    x = torch.randn(1, 3, 9, 9)
    scripted = quietly_script(model) if not callable(act) or isinstance(act, nn.Module) else None
    result = cpu(scripted if scripted is not None else model, x)
    hist = ops(result.module)
    assert not {
        k
        for k in hist
        if k.startswith("aten::") and ("relu" in k or "hardtanh" in k or "clamp" in k)
    }
    assert result.report.record("fuse_clamp").rewrites == 2
    contexts = [
        value
        for key, value in jit._jit_debug_module_iterators(result.module._c)["named_attributes"]
        if key.startswith("prepack_folding")
    ]
    states = sorted((tuple(c.__getstate__()[0][-2:]) for c in contexts), key=str)
    assert states == [bounds, bounds]
    assert_equivalent(model, result.module, x)


class ReluThenHardtanh(nn.Module):
    """Upstream #35705: a second clamp must not overwrite the first one's bounds."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(F.relu(self.conv(x)), -2.0, 0.5)


def test_second_clamp_is_not_fused_over_the_first() -> None:
    model = ReluThenHardtanh().eval()
    x = torch.randn(1, 3, 5, 5)
    result = cpu(model, x)
    hist = ops(result.module)  # the hardtanh then writes into the conv's output
    assert hist.get("aten::hardtanh", 0) + hist.get("aten::hardtanh_", 0) == 1
    assert result.report.record("fuse_clamp").skips == {
        "prepacked::conv2d_clamp_prepack bounds already set": 1
    }
    assert_equivalent(model, result.module, x)


class TwoUsers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.relu(y) + y


def test_activation_not_fused_when_the_unclamped_output_is_used_too() -> None:
    model = TwoUsers().eval()
    x = torch.randn(1, 3, 5, 5)
    result = cpu(model, x, blocklist={MobileOptimizerType.FUSE_ADD_RELU})
    assert ops(result.module)["aten::relu"] == 1
    assert result.report.record("fuse_clamp").skips == {
        "prepacked::conv2d_clamp_run output has 2 users": 1
    }
    assert_equivalent(model, result.module, x)


class Crossed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(self.conv(x), 1.0, -1.0)  # min > max: every value becomes max


def test_crossed_clamp_bounds_are_left_alone() -> None:
    model = Crossed().eval()
    x = torch.randn(1, 3, 5, 5)
    result = cpu(model, x)
    assert result.report.record("fuse_clamp").skips == {"aten::clamp bounds cross (min > max)": 1}
    assert_equivalent(model, result.module, x)


class DynamicWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.w * x.mean())


def test_weight_computed_from_the_input_keeps_its_prepack_and_says_so() -> None:
    model = DynamicWeight().eval()
    x = torch.randn(1, 3, 6, 6)
    result = cpu(model, x)
    assert ops(result.module)["prepacked::conv2d_clamp_prepack"] == 1
    skips = result.report.record("fold_prepacking").skips
    assert skips == {
        "prepacked::conv2d_clamp_prepack has a non-constant input (repacks on every call)": 1
    }
    assert "RUNTIME_PREPACK" in {lint["name"] for lint in result.report.lints or []}
    assert_equivalent(model, result.module, x)


class StringPadding(nn.Module):
    def __init__(self, padding: str, kernel: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, kernel, padding=padding, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


@pytest.mark.parametrize(
    "padding,kernel,dilation", [("same", 3, 1), ("same", 3, 2), ("valid", 2, 1), ("same", 5, 1)]
)
def test_string_padding_conv_is_prepacked(padding: str, kernel: int, dilation: int) -> None:
    model = StringPadding(padding, kernel, dilation).eval()
    x = torch.randn(1, 3, 9, 9)
    result = cpu(model, x)
    assert result.report.record("canonicalize_convolutions").rewrites == 1
    assert ops(result.module).get("prepacked::conv2d_clamp_run") == 1
    assert "aten::conv2d" not in ops(result.module)
    assert_equivalent(model, result.module, x)


def test_asymmetric_same_padding_stays_aten_with_a_reason() -> None:
    model = StringPadding("same", 2).eval()  # 1 in total: torch pads it at the end
    x = torch.randn(1, 3, 7, 7)
    result = cpu(model, x)
    assert result.report.record("canonicalize_convolutions").skips == {
        "'same' padding of kernel [2, 2] is asymmetric (no integer padding says it)": 1
    }
    assert result.report.record("insert_prepacked_ops").skips == {
        "aten::conv2d with string padding": 1
    }
    assert "NOT_PREPACKED" in {lint["name"] for lint in result.report.lints or []}
    assert_equivalent(model, result.module, x)


def test_conv1d_runs_as_prepacked_conv2d() -> None:
    model = nn.Sequential(nn.Conv1d(4, 6, 3, stride=2, padding=1), nn.ReLU()).eval()
    x = torch.randn(2, 4, 15)
    result = cpu(model, x)
    hist = ops(result.module)
    assert hist["prepacked::conv2d_clamp_run"] == 1 and "aten::conv1d" not in hist
    assert_equivalent(model, result.module, x)


def test_insert_fold_prepack_ops_blocklisted_by_upstream_member() -> None:
    model = Layers().eval()
    x = torch.randn(1, 3, 8, 8)
    # torch's stub declares _MobileOptimizerType without its members
    upstream = torch._C._MobileOptimizerType.INSERT_FOLD_PREPACK_OPS  # type: ignore[attr-defined]
    result = cpu(model, x, blocklist=[upstream])
    hist = ops(result.module)
    assert hist["aten::conv2d"] == 2 and not any(k.startswith("prepacked::") for k in hist)
    assert result.module.mobile_optimized is True
    assert_equivalent(model, result.module, x)


@pytest.fixture(scope="module")
def mobilenet_v2() -> nn.Module:
    torch.manual_seed(0)
    return randomize_batchnorm(torchvision.models.mobilenet_v2(weights=None)).eval()


def test_mobilenet_v2_end_to_end_in_the_lite_interpreter(
    mobilenet_v2: nn.Module, tmp_path: Path
) -> None:
    x = torch.randn(1, 3, 224, 224)
    before = copy.deepcopy(mobilenet_v2.state_dict())
    result = cpu(mobilenet_v2, x)
    names = set(torch.jit.export_opnames(result.module))
    assert {"prepacked::conv2d_clamp_run", "prepacked::linear_clamp_run"} <= names
    for banned in (
        "aten::conv2d",
        "aten::batch_norm",
        "aten::dropout",
        "aten::relu",
        "aten::hardtanh",
    ):
        assert not any(n.split(".")[0] == banned for n in names), banned
    assert not any(n.split(".")[0].endswith("_prepack") for n in names)
    path = tmp_path / "mobilenet_v2.ptl"
    result.save(path)
    lite = torch.jit.mobile._load_for_lite_interpreter(str(path))
    with torch.no_grad():
        expected = mobilenet_v2(x)
    got = lite(x)
    assert float((got - expected).abs().max()) <= 1e-4 * float(expected.abs().max())
    for key, value in mobilenet_v2.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert result.report.numerics_passed


def test_resnet18_end_to_end() -> None:
    torch.manual_seed(1)
    model = randomize_batchnorm(torchvision.models.resnet18(weights=None)).eval()
    x = torch.randn(1, 3, 64, 64)
    result = cpu(model, x)
    hist = ops(result.module)
    assert hist["prepacked::conv2d_clamp_run"] == 20 and hist["prepacked::linear_clamp_run"] == 1
    # the residual add + relu stay two ops (a float _add_relu loses NaN); each of the 7 that a
    # conv reads writes into the conv before it, relu_ after
    assert not {"aten::_add_relu", "aten::_add_relu_"} & set(hist)
    assert (hist["aten::add_"], hist["aten::add"], hist["aten::relu_"]) == (7, 1, 8)
    assert result.report.record("fuse_add_relu").skips == {FLOATING: 1}
    assert_equivalent(model, result.module, x, rel=1e-4)


class WithExport(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))

    @torch.jit.export
    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)).mean((2, 3))


@pytest.mark.parametrize("scripted", [False, True], ids=["eager", "scripted"])
def test_preserved_method_is_kept_and_rewritten(scripted: bool) -> None:
    model = randomize_batchnorm(WithExport()).eval()
    given = quietly_script(model) if scripted else model
    x = torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(given, preserved_methods=["features"], example_inputs=x)
    module = result.module
    graph_ops = op_histogram(module, ["features"])
    assert graph_ops["prepacked::conv2d_clamp_run"] == 1 and "aten::batch_norm" not in graph_ops
    torch.testing.assert_close(module.features(x), model.features(x), rtol=1e-5, atol=1e-5)
    assert_equivalent(model, module, x)


def test_bundled_inputs_survive() -> None:
    model = quietly_script(Layers().eval())
    torch.utils.bundled_inputs.augment_model_with_bundled_inputs(
        model, [(torch.utils.bundled_inputs.bundle_randn(1, 3, 8, 8),)]
    )
    optimized = fxmobile.optimize_for_mobile(model)
    inputs = optimized.get_all_bundled_inputs()
    assert optimized.get_num_bundled_inputs() == 1
    torch.testing.assert_close(optimized(*inputs[0]), model(*inputs[0]), rtol=1e-5, atol=1e-5)
    assert not [
        lint
        for lint in fxmobile.generate_mobile_module_lints(optimized)
        if lint["name"] == "BUNDLED_INPUT"
    ]


def _quantized_mobilenet_v2() -> torch.jit.ScriptModule:
    from torchvision.models.quantization import mobilenet_v2

    torch.manual_seed(0)
    model = mobilenet_v2(weights=None, quantize=False).eval()
    model.fuse_model()
    model.qconfig = torch.ao.quantization.get_default_qconfig("qnnpack")
    torch.ao.quantization.prepare(model, inplace=True)
    with torch.no_grad():
        model(torch.randn(4, 3, 224, 224))
    torch.ao.quantization.convert(model, inplace=True)
    # convert's new modules start in training mode, nnq.Dropout (a Dropout) among them
    return quietly_script(model.eval())


def test_quantized_mobilenet_v2_shrinks_and_matches() -> None:
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "qnnpack"
    try:
        scripted = _quantized_mobilenet_v2()
        x = torch.randn(1, 3, 224, 224)
        result = fxmobile.optimize(scripted, example_inputs=x)
        before = len(scripted._save_to_buffer_for_lite_interpreter())
        assert result.report.file_bytes is not None and result.report.file_bytes < before
        assert torch.equal(result.module(x), scripted(x))
        assert "quantized::conv2d" in {
            n.split(".")[0] for n in torch.jit.export_opnames(result.module)
        }
    finally:
        torch.backends.quantized.engine = previous


def test_scripted_input_is_never_modified() -> None:
    model = quietly_script(randomize_batchnorm(WithExport()).eval())
    code, state = model.code, {k: v.clone() for k, v in model.state_dict().items()}
    fxmobile.optimize_for_mobile(model)
    assert model.code == code and not model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key])
    buffer = io.BytesIO()
    torch.jit.save(model, buffer)  # still a whole, saveable module


def test_backend_names_are_case_insensitive_and_unknown_ones_refused() -> None:
    model = nn.Sequential(nn.Linear(3, 3)).eval()
    assert fxmobile.optimize_for_mobile(model, backend="cpu").mobile_optimized
    with pytest.raises(
        TypeError, match="Unknown backend, must be one of 'CPU', 'Vulkan' or 'Metal'"
    ):
        fxmobile.optimize_for_mobile(model, backend="tpu")


def test_missing_preserved_method_raises_upstreams_error() -> None:
    with pytest.raises(
        AttributeError,
        match="The following methods to preserve do not exist in script_module: nope, nada",
    ):
        fxmobile.optimize_for_mobile(
            quietly_script(Layers().eval()), preserved_methods=["nope", "nada"]
        )
