"""Regression tests for the upstream bugs fxmobile must never repeat.

One test per bug in the reference sheet, named after the pytorch/pytorch issue, each through the
full ``fxmobile.optimize(model, example_inputs=x)`` on CPU (and through ``optimize_fx`` where the
bug is one of FX folding), checked against eager in float64 with random BatchNorm statistics.
Then what every optimized model must do: give the same graph when optimized twice, the right
answers on every call, and the same outputs after ``torch.jit.save``/``load`` and after a
lite-interpreter round trip.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.ao.quantization as tq
from torch import nn
from torch.jit.mobile import _load_for_lite_interpreter
from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf

import fxmobile
from tests.helpers import assert_equivalent, count_modules, randomize_batchnorm


def optimize_both(
    model: nn.Module, x: torch.Tensor
) -> tuple[fxmobile.FxResult, fxmobile.MobileResult]:
    """The FX stage alone and the whole pipeline, both checked against eager."""
    fx_result = fxmobile.optimize_fx(model, x)
    assert fx_result.report.numerics_passed
    assert_equivalent(model, fx_result.graph_module, x)
    result = fxmobile.optimize(model, example_inputs=x)
    assert result.report.numerics_passed
    assert_equivalent(model, result.module, x)
    return fx_result, result


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_state_unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} of the caller's model changed"


class SharedConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) + self.conv(x * 2)


def test_issue_104593_shared_conv_called_twice() -> None:
    """Upstream's FX fusion folded BN into a conv that a second call also used, in place, in
    the caller's model: the second call (and the user's model) then computed conv+BN."""
    model = randomize_batchnorm(SharedConv()).eval()
    before = state_of(model)
    x = torch.randn(2, 3, 8, 8)
    fx_result, _ = optimize_both(model, x)
    assert_state_unchanged(model, before)
    # the BN may be folded into a copy of the conv, but the shared conv itself stays unfused
    gm = fx_result.graph_module
    called = [gm.get_submodule(n.target) for n in gm.graph.nodes if n.op == "call_module"]
    convs = [m for m in called if isinstance(m, nn.Conv2d)]
    assert any(torch.equal(c.weight, model.conv.weight) for c in convs)


def test_issue_127227_conv_without_bias_then_batchnorm() -> None:
    """Upstream lost the BN's shift when the conv had no bias to fold it into."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU())
    model = randomize_batchnorm(model).eval()
    x = torch.randn(2, 3, 10, 10)
    fx_result, _ = optimize_both(model, x)
    gm = fx_result.graph_module
    assert count_modules(gm, nn.BatchNorm2d) == 0, "the BN was not folded"
    conv = next(m for m in gm.modules() if isinstance(m, nn.Conv2d))
    assert conv.bias is not None


def test_issue_71259_batchnorm_without_running_stats_left_alone() -> None:
    """A BN with ``track_running_stats=False`` normalizes with the batch's statistics even in
    eval mode; upstream folded it as if it had running stats."""
    bn = nn.BatchNorm2d(8, track_running_stats=False)
    model = randomize_batchnorm(nn.Sequential(nn.Conv2d(3, 8, 3), bn)).eval()
    x = torch.randn(4, 3, 10, 10)
    fx_result, result = optimize_both(model, x)
    assert count_modules(fx_result.graph_module, nn.BatchNorm2d) == 1
    other = torch.randn(3, 3, 10, 10) * 3 + 1  # other batch, other statistics
    assert_equivalent(model, result.module, other)


@pytest.mark.parametrize(
    ("linear", "bn", "shape"),
    [
        (nn.Linear(10, 20), nn.BatchNorm2d(5), (2, 5, 3, 10)),  # the issue's own model
        (nn.Linear(3, 2), nn.BatchNorm2d(2), (2, 2, 4, 3)),  # sizes match, axes do not
    ],
    ids=["mismatched_features", "matching_size_wrong_axis"],
)
def test_issue_118990_linear_then_batchnorm_on_another_axis(
    linear: nn.Linear, bn: nn.BatchNorm2d, shape: tuple[int, ...]
) -> None:
    """Linear acts on the last dim, BatchNorm2d on dim 1: upstream folded them anyway
    (``torch.jit.freeze`` crashed; with equal sizes the fold is silently wrong)."""
    model = randomize_batchnorm(nn.Sequential(linear, bn, nn.ReLU())).eval()
    x = torch.randn(*shape)
    fx_result, _ = optimize_both(model, x)
    # the BN may be decomposed into a per-channel affine op, but not folded into the linear
    gm = fx_result.graph_module
    folded = next(m for m in gm.modules() if isinstance(m, nn.Linear))
    assert torch.equal(folded.weight, linear.weight) and torch.equal(folded.bias, linear.bias)


def test_issue_76578_folding_keeps_the_conv_dtype() -> None:
    """Upstream's fold produced float32 weights for a float64 model."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8 * 36, 4))
    model = randomize_batchnorm(model).eval().double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    fx_result, result = optimize_both(model, x)
    assert count_modules(fx_result.graph_module, nn.BatchNorm2d) == 0
    assert all(p.dtype == torch.float64 for p in fx_result.graph_module.parameters())
    out = result.module(x)
    assert out.dtype == torch.float64
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("cin", "cout", "groups"), [(4, 4, 2), (6, 4, 2), (8, 12, 4)])
def test_issue_180995_conv_transpose_batchnorm_with_groups(
    cin: int, cout: int, groups: int
) -> None:
    """A transposed conv's weight is ``[in, out/groups, k, k]``: upstream scaled dim 1 as if it
    held all output channels, which fails or is wrong when ``groups > 1``."""
    deconv = nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, groups=groups, bias=False)
    model = randomize_batchnorm(nn.Sequential(deconv, nn.BatchNorm2d(cout))).eval()
    x = torch.randn(2, cin, 5, 5)
    fx_result, _ = optimize_both(model, x)
    assert count_modules(fx_result.graph_module, nn.BatchNorm2d) == 0


@pytest.mark.parametrize(
    "layers",
    [
        lambda: [nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Hardtanh(-1.0, 6.0)],
        lambda: [nn.Linear(12, 8), nn.ReLU(), nn.Hardtanh(-1.0, 6.0)],
        lambda: [nn.Conv2d(3, 8, 3), nn.Hardtanh(-1.0, 6.0), nn.ReLU()],
        lambda: [nn.Conv2d(3, 8, 3), nn.ReLU6(), nn.Hardtanh(2.0, 8.0)],
    ],
    ids=["conv_relu_hardtanh", "linear_relu_hardtanh", "conv_hardtanh_relu", "relu6_hardtanh"],
)
def test_issue_35705_second_clamp_does_not_overwrite_the_first(
    layers: Callable[[], list[nn.Module]],
) -> None:
    """After relu was fused into a prepacked op (min=0), fusing a following hardtanh(-1, 6)
    must not replace the bounds with (-1, 6): the negative values would come back."""
    model = nn.Sequential(*layers()).eval()
    x = torch.randn(2, 3, 6, 12) * 10  # outputs well below -1 and well above 6
    _, result = optimize_both(model, x)
    assert result.report.record("fuse_clamp").rewrites >= 1, "no clamp was fused: vacuous"
    with torch.no_grad():
        out = result.module(x)
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-4)


def test_issue_52463_optimized_model_runs_many_times() -> None:
    """Upstream's optimized mobilenet_v3 crashed on its third forward. Here: mobilenet_v3_small
    cut to its first four blocks (squeeze-excitation, hardswish, hardsigmoid, depthwise convs
    all present) to keep the test fast, run four times on different inputs."""
    settings, last_channel = _mobilenet_v3_conf("mobilenet_v3_small")
    model = MobileNetV3(settings[:4], last_channel, num_classes=10)
    model = randomize_batchnorm(model).eval()
    result = fxmobile.optimize(model, example_inputs=torch.randn(1, 3, 32, 32))
    assert result.report.numerics_passed
    gen = torch.Generator().manual_seed(1)
    for batch in (1, 2, 1, 3):
        x = torch.randn(batch, 3, 32, 32, generator=gen)
        assert_equivalent(model, result.module, x, rel=1e-4)


class ConvBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def test_optimize_for_mobile_freezes_a_training_batchnorm_inside_an_eval_scriptmodule() -> None:
    """Upstream's optimize_for_mobile on a ScriptModule in eval whose BatchNorm was put back in
    training (``model.eval(); model.bn.train()``) folds the running statistics into the conv:
    the module normalizes with batch statistics, the optimized one with running ones (off by
    34-40% in issue 24), and without example inputs nothing tells. fxmobile refuses it as it
    refuses the eager model (``TrainingModeError``, naming ``bn``), with or without example
    inputs; ``eval_copy=True`` optimizes an eval-mode copy, checked against eager in eval."""
    torch.manual_seed(0)
    scripted = torch.jit.script(randomize_batchnorm(ConvBn()).eval())
    scripted.bn.train()
    before = {k: v.clone() for k, v in scripted.state_dict().items()}
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        batch_stats = copy.deepcopy(scripted)(x)  # a training BN updates its statistics
        running_stats = copy.deepcopy(scripted).eval()(x)
    off = float((batch_stats - running_stats).abs().max() / batch_stats.abs().max())
    assert off > 0.1, "the two modes must differ for the refusal to matter"
    with pytest.raises(fxmobile.TrainingModeError, match=r"1 submodules.*: bn\).*model\.eval"):
        fxmobile.optimize_for_mobile(scripted)
    with pytest.raises(fxmobile.TrainingModeError, match="eval_copy=True"):
        fxmobile.optimize(scripted, example_inputs=x)
    result = fxmobile.optimize(scripted, example_inputs=x, eval_copy=True)
    assert result.report.numerics_passed
    with torch.no_grad():
        torch.testing.assert_close(result.module(x), running_stats, rtol=1e-4, atol=1e-4)
    assert scripted.bn.training and not scripted.training, "the caller's modes are left alone"
    for key, value in scripted.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} of the caller's module changed"


def test_a_scriptmodule_whose_pickling_methods_read_training_is_not_refused() -> None:
    """torch.ao's quantized convolutions save ``training`` in ``__getstate__`` and come out of
    ``convert`` in training mode: their forward never reads it, so the refusal above must not
    take them for a module that computes something else in training mode."""
    torch.backends.quantized.engine = "qnnpack"
    model = tq.QuantWrapper(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())).eval()
    model.qconfig = tq.get_default_qconfig("qnnpack")
    tq.prepare(model, inplace=True)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        model(x)
    tq.convert(model, inplace=True)
    scripted = torch.jit.script(model)
    assert any(m.training for m in scripted.modules()), "convert makes training submodules"
    result = fxmobile.optimize(scripted, example_inputs=x)
    assert torch.equal(result.module(x), scripted(x))


# ---------------------------------------------------------------- every optimized model


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 5)
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(self.dw(y) + y)
        return self.fc(self.drop(y.mean((2, 3))))


@pytest.fixture(scope="module")
def small() -> tuple[nn.Module, fxmobile.MobileResult]:
    model = randomize_batchnorm(Small()).eval()
    return model, fxmobile.optimize(model, example_inputs=torch.randn(2, 3, 8, 8))


def unmangled(text: str) -> str:
    """Without the two global counters in graph text: TorchScript numbers each compiled class
    (``___torch_mangle_405``) and torch.fx each generated source file (``<eval_with_key>.9``,
    in the graph's source-location comments). The same graph compiled twice differs only there.
    """
    text = re.sub(r"___torch_mangle_\d+", "___torch_mangle_N", text)
    return re.sub(r"<eval_with_key>\.\d+", "<eval_with_key>.N", text)


def test_optimizing_twice_gives_the_same_graph() -> None:
    model = randomize_batchnorm(Small()).eval()
    x = torch.randn(2, 3, 8, 8)
    first = fxmobile.optimize(copy.deepcopy(model), example_inputs=x).module
    second = fxmobile.optimize(copy.deepcopy(model), example_inputs=x).module
    assert unmangled(str(first.graph)) == unmangled(str(second.graph))
    assert unmangled(first.code) == unmangled(second.code)
    fx_first = fxmobile.optimize_fx(model, x).graph_module
    fx_second = fxmobile.optimize_fx(model, x).graph_module
    assert fx_first.code == fx_second.code


def test_optimized_model_is_right_on_every_call(
    small: tuple[nn.Module, fxmobile.MobileResult],
) -> None:
    model, result = small
    gen = torch.Generator().manual_seed(7)
    for batch in (1, 2, 3):
        x = torch.randn(batch, 3, 8, 8, generator=gen)
        assert_equivalent(model, result.module, x)


def test_save_and_load_give_identical_outputs(
    small: tuple[nn.Module, fxmobile.MobileResult], tmp_path: Path
) -> None:
    _, result = small
    path = tmp_path / "model.pt"
    torch.jit.save(result.module, str(path))
    loaded = torch.jit.load(str(path))
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(loaded(x), result.module(x))


def test_lite_interpreter_round_trip_gives_identical_outputs(
    small: tuple[nn.Module, fxmobile.MobileResult], tmp_path: Path
) -> None:
    _, result = small
    path = tmp_path / "model.ptl"
    result.save(path)
    lite = _load_for_lite_interpreter(str(path))
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = result.module(x)
        assert torch.equal(lite(x), expected)
        assert torch.equal(lite(x), expected)  # and again: the packed state survives a call
