"""The Metal TorchScript stage: prepack/run pairs, clamp fusion, folding, end to end.

fxmobile's kernels run the Metal ops on the CPU, so every result runs here. Upstream's own pass,
``torch._C._jit_pass_metal_optimize_for_mobile``, runs here once fxmobile's op library is loaded,
and serves as the oracle: same ops and counts, or a documented reason for each difference.
"""

from __future__ import annotations

import copy
from collections import Counter
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
from fxmobile.backends.library import OpFamily, ensure_registered
from fxmobile.script.graph_utils import op_histogram
from fxmobile.script.jit_passes import jit
from fxmobile.script.quiet_script import quietly_script
from tests.helpers import assert_equivalent, randomize_batchnorm


def metal(model: nn.Module, **kwargs: object) -> fxmobile.MobileResult:
    return fxmobile.optimize(model, backend="metal", **kwargs)  # type: ignore[call-overload]


def ops(module: torch.jit.ScriptModule, method: str = "forward") -> Counter[str]:
    return op_histogram(module, [method])


def upstream(
    scripted: torch.jit.ScriptModule, preserved: list[str] | None = None
) -> torch.jit.ScriptModule:
    """Upstream's Metal pipeline on the same scripted module (the oracle)."""
    ensure_registered(OpFamily.METAL)
    out = jit._jit_pass_metal_optimize_for_mobile(scripted._c, preserved or [])
    return torch.jit._recursive.wrap_cpp_module(out)


def differences(ours: Counter[str], theirs: Counter[str]) -> dict[str, tuple[int, int]]:
    """Op kinds whose counts differ: kind -> (fxmobile, upstream)."""
    return {
        k: (ours[k], theirs[k]) for k in sorted(set(ours) | set(theirs)) if ours[k] != theirs[k]
    }


def states(module: torch.jit.ScriptModule) -> list[tuple[object, ...]]:
    """The pickled state of every folded context: the prepack op's arguments."""
    return [
        value._get_method("__getstate__")()
        for key, value in jit._jit_debug_module_iterators(module._c)["named_attributes"]
        if key.startswith("prepack_folding")
    ]


def lite(result: fxmobile.MobileResult, path: Path) -> torch.jit.ScriptModule:
    """The result saved for, and loaded by, the lite interpreter."""
    result.save(path)
    return torch.jit.mobile._load_for_lite_interpreter(str(path))


class Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8, bias=False)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2)  # Metal has no transposed conv op
        self.fc = nn.Linear(4, 5)
        self.drop = nn.Dropout()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(self.dw(self.bn(self.conv(x))))
        return self.fc(self.drop(y.mean((2, 3))))


def test_linear_and_conv2d_become_folded_prepack_run_pairs(tmp_path: Path) -> None:
    model = Layers()
    randomize_batchnorm(model).eval()
    scripted = quietly_script(model)
    x = torch.randn(2, 3, 16, 16)
    result = metal(scripted)
    hist = ops(result.module)
    assert hist["metal_prepack::conv2d_run"] == 2 and hist["metal_prepack::linear_run"] == 1
    assert hist["aten::conv_transpose2d"] == 1
    assert not {"aten::conv2d", "aten::linear", "aten::batch_norm", "aten::dropout"} & set(hist)
    assert not [k for k in hist if k.endswith("_prepack")]
    assert result.report.record("insert_prepacked_ops").rewrites == 3
    assert result.report.record("fold_prepacking").rewrites == 3
    assert result.module.optimized_for_metal is True
    linear = next(s for s in states(result.module) if len(s) == 4)
    torch.testing.assert_close(linear[0], model.fc.weight, rtol=0, atol=0)  # not transposed
    assert_equivalent(model, result.module, x)
    assert_equivalent(model, lite(result, tmp_path / "layers.ptl"), x)
    assert differences(hist, ops(upstream(scripted))) == {}  # the oracle: same ops, same counts


class Activated(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.fc = nn.Linear(6, 6)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.conv(x))
        return self.act(self.fc(y.mean((2, 3))))


class Clamp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, -0.1, 0.2)


# activation -> (bounds fused into both contexts, what upstream leaves unfused)
ACTIVATIONS = {
    "relu": (nn.ReLU(), (0.0, None), {}),
    "relu_": (nn.ReLU(inplace=True), (0.0, None), {}),
    "hardtanh": (nn.Hardtanh(-0.5, 0.25), (-0.5, 0.25), {}),
    "hardtanh_": (nn.Hardtanh(-0.5, 0.25, inplace=True), (-0.5, 0.25), {}),
    "relu6": (nn.ReLU6(), (0.0, 6.0), {}),  # scripted as hardtanh(x, 0, 6): upstream fuses it
    "clamp": (Clamp(), (-0.1, 0.2), {"aten::clamp": (0, 2)}),  # upstream has no clamp pattern
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_clamp_fuses_into_linear_and_conv2d(name: str) -> None:
    act, bounds, upstream_differs = ACTIVATIONS[name]
    model = Activated(copy.deepcopy(act)).eval()
    scripted = quietly_script(model)
    x = torch.randn(1, 3, 9, 9)
    result = metal(scripted)
    hist = ops(result.module)
    assert hist == Counter(
        {"metal_prepack::conv2d_run": 1, "metal_prepack::linear_run": 1, "aten::mean": 1}
    )
    assert result.report.record("fuse_clamp").rewrites == 2
    assert sorted(tuple(s[-2:]) for s in states(result.module)) == [bounds, bounds]
    assert_equivalent(model, result.module, x)
    assert differences(hist, ops(upstream(scripted))) == upstream_differs


class SamePadding(nn.Module):
    def __init__(self, kernel: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, kernel, padding="same")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_symmetric_same_padding_conv_is_prepacked() -> None:
    model = SamePadding(3).eval()
    result = metal(quietly_script(model))
    assert ops(result.module) == Counter({"metal_prepack::conv2d_run": 1})
    assert_equivalent(model, result.module, torch.randn(1, 3, 7, 7))


def test_asymmetric_same_padding_conv_stays_aten_with_a_reason() -> None:
    model = SamePadding(2).eval()
    result = metal(quietly_script(model))
    assert ops(result.module)["aten::conv2d"] == 1
    assert result.report.record("insert_prepacked_ops").skips == {
        "aten::conv2d with string padding": 1
    }
    assert_equivalent(model, result.module, torch.randn(1, 3, 7, 7))


class InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y.add_(1)
        return y.sigmoid_()


def test_mutation_is_removed() -> None:
    model = InPlace().eval()
    result = metal(quietly_script(model))
    hist = ops(result.module)
    assert hist["aten::add"] == 1 and hist["aten::sigmoid"] == 1
    assert result.report.record("remove_mutation").rewrites == 2
    assert_equivalent(model, result.module, torch.randn(1, 3, 4, 4))


def test_metal_takes_no_blocklist() -> None:
    model = randomize_batchnorm(Layers()).eval()
    everything = frozenset(MobileOptimizerType)
    result = metal(quietly_script(model), blocklist=everything)
    hist = ops(result.module)
    assert hist["metal_prepack::conv2d_run"] == 2 and "aten::batch_norm" not in hist
    assert not [r for r in result.report.passes if r.status.name == "BLOCKLISTED"]
    assert not result.module._c.hasattr("requires_backend_transfers")
    assert_equivalent(model, result.module, torch.randn(1, 3, 8, 8))


def test_other_instances_of_the_same_classes_are_untouched() -> None:
    """Inserting after freezing: scripted siblings share compiled types until then."""
    model, sibling = Layers().eval(), Layers().eval()
    scripted, scripted_sibling = quietly_script(model), quietly_script(sibling)
    code = scripted_sibling.conv.code
    metal(scripted)
    assert scripted_sibling.conv.code == code and scripted.conv.code == code
    assert "metal_prepack" not in str(scripted_sibling.conv.graph)
    assert_equivalent(sibling, scripted_sibling, torch.randn(1, 3, 8, 8))


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18"])
def test_torchvision_model_matches_the_oracle_eager_and_the_lite_interpreter(
    name: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = randomize_batchnorm(getattr(torchvision.models, name)(weights=None)).eval()
    scripted = quietly_script(copy.deepcopy(model))
    result = metal(scripted)
    theirs = upstream(scripted)
    assert differences(ops(result.module), ops(theirs)) == {}
    assert sorted(torch.jit.export_opnames(result.module)) == sorted(
        torch.jit.export_opnames(theirs)
    )
    x = torch.randn(1, 3, 32, 32)
    loaded = lite(result, tmp_path / f"{name}_metal.ptl")
    with torch.no_grad():
        expected = model(x)
    assert float((loaded(x) - expected).abs().max()) <= 1e-4 * float(expected.abs().max())


class WithExport(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))

    @torch.jit.export
    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu_(self.fc(F.relu(self.bn(self.conv(x))).mean((2, 3))))


def test_preserved_method_is_rewritten_fused_and_functional() -> None:
    model = WithExport()
    randomize_batchnorm(model).eval()
    scripted = quietly_script(model)
    x = torch.randn(1, 3, 8, 8)
    result = metal(scripted, preserved_methods=["features"])
    hist = ops(result.module, "features")
    assert hist == Counter(
        {"metal_prepack::conv2d_run": 1, "metal_prepack::linear_run": 1, "aten::mean": 1}
    )
    torch.testing.assert_close(result.module.features(x), model.features(x), rtol=1e-5, atol=1e-5)
    assert_equivalent(model, result.module, x)
    # upstream fuses clamps into forward only
    theirs = upstream(scripted, preserved=["features"])
    assert differences(hist, ops(theirs, "features")) == {
        "aten::relu": (0, 1),
        "aten::relu_": (0, 1),
    }
    assert differences(ops(result.module), ops(theirs)) == {}


def test_bundled_inputs_survive() -> None:
    model = randomize_batchnorm(WithExport()).eval()
    scripted = quietly_script(model)
    torch.utils.bundled_inputs.augment_model_with_bundled_inputs(
        scripted, [(torch.utils.bundled_inputs.bundle_randn(1, 3, 8, 8),)]
    )
    optimized = fxmobile.optimize_for_mobile(scripted, backend="metal")
    assert optimized.get_num_bundled_inputs() == 1
    inputs = optimized.get_all_bundled_inputs()
    torch.testing.assert_close(optimized(*inputs[0]), model(*inputs[0]), rtol=1e-5, atol=1e-5)
    assert dict(ops(optimized)) == {"metal_prepack::conv2d_run": 1}
    assert optimized.optimized_for_metal is True
