"""The Vulkan TorchScript stage: create/run pairs, clamp fusion, folding, GPU transfer, end to end.

Numerics run with ``VULKAN_AUTOMATIC_GPU_TRANSFER`` blocklisted (this machine has no Vulkan
device; fxmobile's kernels run the Vulkan ops on the CPU). Upstream's own pass,
``torch._C._jit_pass_vulkan_optimize_for_mobile``, runs here once fxmobile's op library is
loaded, and serves as the oracle: same ops and counts, or a documented reason for each difference.
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
from fxmobile.script.graph_utils import iter_nodes, op_histogram
from fxmobile.script.jit_passes import jit
from fxmobile.script.quiet_script import quietly_script
from tests.helpers import assert_equivalent, randomize_batchnorm
from tests.models import DynamicWeight, Recurrent, TwoInputs

GPU_TRANSFER = MobileOptimizerType.VULKAN_AUTOMATIC_GPU_TRANSFER
NO_TRANSFER = frozenset({GPU_TRANSFER})


def vulkan(
    model: nn.Module, blocklist: frozenset[MobileOptimizerType] = NO_TRANSFER, **kwargs: object
) -> fxmobile.MobileResult:
    return fxmobile.optimize(model, blocklist, backend="vulkan", **kwargs)  # type: ignore[call-overload]


def ops(module: torch.jit.ScriptModule, method: str = "forward") -> Counter[str]:
    return op_histogram(module, [method])


def upstream(
    scripted: torch.jit.ScriptModule, transfer: bool = False, preserved: list[str] | None = None
) -> torch.jit.ScriptModule:
    """Upstream's Vulkan pipeline on the same scripted module (the oracle)."""
    ensure_registered(OpFamily.VULKAN)
    member = torch._C._MobileOptimizerType.VULKAN_AUTOMATIC_GPU_TRANSFER  # type: ignore[attr-defined]
    blocklist = set() if transfer else {member}
    out = jit._jit_pass_vulkan_optimize_for_mobile(scripted._c, blocklist, preserved or [])
    return torch.jit._recursive.wrap_cpp_module(out)


def differences(ours: Counter[str], theirs: Counter[str]) -> dict[str, tuple[int, int]]:
    """Op kinds whose counts differ: kind -> (fxmobile, upstream)."""
    return {
        k: (ours[k], theirs[k]) for k in sorted(set(ours) | set(theirs)) if ours[k] != theirs[k]
    }


def states(module: torch.jit.ScriptModule) -> list[list[object]]:
    """The pickled state (upstream's unpacked list) of every folded context."""
    return [
        value._get_method("__getstate__")()
        for key, value in jit._jit_debug_module_iterators(module._c)["named_attributes"]
        if key.startswith("prepack_folding")
    ]


def lite(result: fxmobile.MobileResult, path: Path) -> torch.jit.ScriptModule:
    """The result saved for, and loaded by, the lite interpreter."""
    result.save(path)
    return torch.jit.mobile._load_for_lite_interpreter(str(path))


def transfers(graph: torch._C.Graph) -> list[tuple[str, str]]:
    """(moved value's producer kind, device) for each aten::to, in graph order."""
    return [
        (n.inputsAt(0).node().kind(), str(n.inputsAt(1).toIValue()))
        for n in iter_nodes(graph)
        if n.kind() == "aten::to"
    ]


# --- each layer ---------------------------------------------------------------------------


class Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1d = nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=1)
        self.conv = nn.Conv2d(6, 8, 3, padding=1, groups=2)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.fc = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)
        self.ln = nn.LayerNorm(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1d(x).unsqueeze(2)  # (N, 6, 1, L)
        y = self.up(self.conv(y)).mean((2, 3))
        return self.ln(self.bn(self.fc(y)))


RUNS = {
    "vulkan_prepack::run_conv1d_context": 1,
    "vulkan_prepack::run_conv2d_context": 1,
    "vulkan_prepack::run_tconv2d_context": 1,
    "vulkan_prepack::run_linear_context": 1,
    "vulkan_prepack::run_batchnorm_context": 1,
    "vulkan_prepack::run_layernorm_context": 1,
}


def test_each_layer_becomes_a_folded_create_run_pair(tmp_path: Path) -> None:
    model = randomize_batchnorm(Layers()).eval()
    x = torch.randn(2, 4, 9)
    scripted = quietly_script(model)
    result = vulkan(scripted)
    hist = ops(result.module)
    assert {k: hist[k] for k in RUNS} == RUNS
    assert not [k for k in hist if "create_" in k or k.split("::")[1] in _ATEN_LAYERS]
    assert result.report.record("insert_prepacked_ops").rewrites == 6
    assert result.report.record("fold_prepacking").rewrites == 6
    assert result.module.optimized_for_vulkan is True
    assert not result.module._c.hasattr("requires_backend_transfers")
    assert_equivalent(model, result.module, x)
    assert_equivalent(model, lite(result, tmp_path / "layers.ptl"), x)
    assert differences(hist, ops(upstream(scripted))) == {}  # the oracle: same ops, same counts


_ATEN_LAYERS = {"conv1d", "conv2d", "conv_transpose2d", "linear", "batch_norm", "layer_norm"}


def test_linear_context_holds_the_transposed_weight_and_tconv_its_own_argument_order() -> None:
    model = Layers().eval()
    result = vulkan(quietly_script(model))
    linear = next(s for s in states(result.module) if len(s) == 2)
    torch.testing.assert_close(linear[0], model.fc.weight.t(), rtol=0, atol=0)
    torch.testing.assert_close(linear[1], model.fc.bias, rtol=0, atol=0)
    tconv = next(s for s in states(result.module) if len(s) == 11 and s[5])  # transposed
    # [W, B, stride, padding, dilation, transposed, quantized, output_padding, groups, min, max]
    assert tconv[2:] == [[2, 2], [1, 1], [1, 1], True, False, [1, 1], 2, None, None]


def test_weight_computed_from_the_input_is_transposed_in_the_graph_and_repacked() -> None:
    model = DynamicWeight().eval()
    result = vulkan(quietly_script(model))
    hist = ops(result.module)
    assert hist["aten::t"] == 1 and hist["vulkan_prepack::create_linear_context"] == 1
    assert result.report.record("fold_prepacking").skips == {
        "vulkan_prepack::create_linear_context has a non-constant input (repacks on every call)": 1
    }
    assert_equivalent(model, result.module, torch.randn(3, 4))


RNN_INPUTS = (
    torch.randn(3, 5, 4),
    torch.randn(2, 3, 6),
    torch.randn(1, 3, 5),
    torch.randn(1, 3, 5),
)


def test_gru_and_lstm_become_folded_create_run_pairs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Recurrent().eval()
    scripted = quietly_script(model)
    result = vulkan(scripted)
    hist = ops(result.module)
    assert hist["vulkan_prepack::run_gru_context"] == 1
    assert hist["vulkan_prepack::run_lstm_context"] == 1
    assert not {"aten::gru", "aten::lstm"} & set(hist)
    assert result.report.record("fold_prepacking").rewrites == 2
    assert_equivalent(model, result.module, *RNN_INPUTS)
    assert_equivalent(model, lite(result, tmp_path / "rnn.ptl"), *RNN_INPUTS)
    assert differences(hist, ops(upstream(scripted))) == {}


class ConvAct(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.fc = nn.Linear(6, 6)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.conv(x))
        return self.act(self.fc(y.mean((2, 3))))


ACTIVATIONS = {
    "relu": (nn.ReLU(), "aten::relu", (0.0, None)),
    "relu_": (nn.ReLU(inplace=True), "aten::relu", (0.0, None)),
    "hardtanh": (nn.Hardtanh(-0.5, 0.25), "aten::hardtanh", (-0.5, 0.25)),
    "hardtanh_": (nn.Hardtanh(-0.5, 0.25, inplace=True), "aten::hardtanh", (-0.5, 0.25)),
    "relu6": (nn.ReLU6(), "aten::hardtanh", (0.0, 6.0)),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_clamp_fuses_into_conv2d_only(name: str) -> None:
    act, kind, bounds = ACTIVATIONS[name]
    model = ConvAct(act).eval()
    x = torch.randn(1, 3, 9, 9)
    result = vulkan(quietly_script(model))
    hist = ops(result.module)
    # the linear's activation stays (Vulkan's linear context takes no bounds), in-place or not
    # it is functional after mutation removal
    assert hist[kind] == 1 and not [k for k in hist if k.endswith("_") and k != kind]
    assert result.report.record("fuse_clamp").rewrites == 1
    (conv,) = (s for s in states(result.module) if len(s) == 11)
    assert tuple(conv[-2:]) == bounds
    assert_equivalent(model, result.module, x)


# --- left alone, with a reason ------------------------------------------------------------


class Single(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


SKIPPED = {
    "string padding": (
        nn.Conv2d(3, 4, 2, padding="same"),  # asymmetric: 1 in total
        torch.randn(1, 3, 6, 6),
        "aten::conv2d",
        "aten::conv2d with string padding",
    ),
    "layer_norm without affine": (
        nn.LayerNorm(5, elementwise_affine=False),
        torch.randn(2, 5),
        "aten::layer_norm",
        "aten::layer_norm without weight and bias (Vulkan needs elementwise_affine=True)",
    ),
    "batch_norm without running stats": (
        nn.BatchNorm1d(5, track_running_stats=False),
        torch.randn(4, 5),
        "aten::batch_norm",
        "aten::batch_norm uses batch statistics (training mode or no running stats)",
    ),
    "batch_norm without affine": (
        nn.BatchNorm1d(5, affine=False),
        torch.randn(4, 5),
        "aten::batch_norm",
        "aten::batch_norm without weight and bias (Vulkan needs affine=True)",
    ),
    "gru not batch_first": (
        nn.GRU(4, 5),
        torch.randn(3, 2, 4),
        "aten::gru",
        "aten::gru without batch_first (Vulkan requires batch_first=True)",
    ),
    "gru bidirectional": (
        nn.GRU(4, 5, batch_first=True, bidirectional=True),
        torch.randn(2, 3, 4),
        "aten::gru",
        "aten::gru bidirectional",
    ),
    "gru with dropout": (
        nn.GRU(4, 5, num_layers=2, dropout=0.5, batch_first=True),
        torch.randn(2, 3, 4),
        "aten::gru",
        "aten::gru with dropout > 0",
    ),
    "lstm with projections": (
        nn.LSTM(4, 5, proj_size=3, batch_first=True),
        torch.randn(2, 3, 4),
        "aten::lstm",
        "aten::lstm with projections",
    ),
}


@pytest.mark.parametrize("name", list(SKIPPED))
def test_what_vulkan_cannot_run_stays_aten_with_the_reason(name: str) -> None:
    layer, x, kind, reason = SKIPPED[name]
    model = Single(copy.deepcopy(layer)).eval()
    result = vulkan(quietly_script(model))
    assert ops(result.module)[kind] == 1
    assert result.report.record("insert_prepacked_ops").skips == {reason: 1}
    assert_equivalent(model, result.module, x)


class InPlace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(1)
        y.relu_()
        x.mul_(3)  # the caller's tensor: torch keeps this one
        return y + x


def test_mutation_removal_counts_what_went_and_reports_what_stayed() -> None:
    model = InPlace()
    result = vulkan(quietly_script(model))
    hist = ops(result.module)
    assert hist["aten::add"] == 2 and hist["aten::relu"] == 1 and hist["aten::mul_"] == 1
    record = result.report.record("remove_mutation")
    assert record.rewrites == 2
    assert record.skips == {"aten::mul_ kept: torch cannot prove no alias observes the write": 1}
    x = torch.randn(3)
    assert torch.equal(result.module(x.clone()), model(x.clone()))


# --- GPU transfer -------------------------------------------------------------------------


def test_gpu_transfer_moves_used_tensor_inputs_and_tensor_outputs() -> None:
    scripted = quietly_script(TwoInputs().eval())
    result = vulkan(scripted, frozenset())
    graph = result.module.graph
    # x moves before its first use; the unused input and the bool do not move; y moves back
    assert transfers(graph) == [("prim::Param", "vulkan"), ("prim::If", "cpu")]
    nodes = list(graph.nodes())
    first = next(i for i, n in enumerate(nodes) if n.kind() == "aten::to")
    assert nodes[first + 1].kind() == "vulkan_prepack::run_conv2d_context"
    assert graph.return_node().inputsAt(0).node().kind() == "aten::to"
    assert result.module.requires_backend_transfers is False
    assert result.module.optimized_for_vulkan is True
    assert result.report.record("insert_gpu_transfers").rewrites == 2
    theirs = upstream(scripted, transfer=True)
    assert transfers(theirs.graph) == transfers(graph)
    assert differences(ops(result.module), ops(theirs)) == {}
    assert theirs.requires_backend_transfers is False


class NestedUse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, flag: bool) -> torch.Tensor:
        y = self.conv(x)
        if flag:
            y = y + x.mean()
        return y + 1


def test_gpu_transfer_covers_an_input_also_used_in_a_nested_block() -> None:
    scripted = quietly_script(NestedUse().eval())
    result = vulkan(scripted, frozenset())
    x = list(result.module.graph.inputs())[1]
    assert [u.user.kind() for u in x.uses()] == ["aten::to"]  # every use reads the moved tensor
    assert [d for _, d in transfers(result.module.graph)] == ["vulkan", "cpu"]
    # upstream inserts before the node preceding the first use, here the block's parameters
    with pytest.raises(RuntimeError, match="before the Param node"):
        upstream(scripted, transfer=True)


def test_gpu_transfer_also_moves_tensors_of_a_returned_tuple() -> None:
    scripted = quietly_script(Recurrent().eval())
    result = vulkan(scripted, frozenset())
    moved = transfers(result.module.graph)
    assert [d for _, d in moved].count("vulkan") == 4 and [d for _, d in moved].count("cpu") == 4
    tuple_node = result.module.graph.return_node().inputsAt(0).node()
    assert tuple_node.kind() == "prim::TupleConstruct"
    assert {v.node().kind() for v in tuple_node.inputs()} == {"aten::to"}
    # upstream moves the four inputs but, the output being a tuple, none of the outputs
    assert differences(ops(result.module), ops(upstream(scripted, transfer=True))) == {
        "aten::to": (8, 4)
    }


def test_only_the_gpu_transfer_member_is_honoured() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout(), nn.ReLU())
    randomize_batchnorm(model).eval()
    ignored = {
        MobileOptimizerType.CONV_BN_FUSION,
        MobileOptimizerType.REMOVE_DROPOUT,
        MobileOptimizerType.INSERT_FOLD_PREPACK_OPS,
    }
    result = vulkan(quietly_script(model), frozenset(ignored))
    assert ops(result.module)["aten::to"] == 2
    result = vulkan(quietly_script(model), frozenset(ignored | {GPU_TRANSFER}))
    assert dict(ops(result.module)) == {"vulkan_prepack::run_conv2d_context": 1}
    assert_equivalent(model, result.module, torch.randn(1, 3, 6, 6))


def test_numerics_check_is_skipped_with_a_note_when_tensors_move_to_vulkan() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3)).eval()
    result = vulkan(model, frozenset(), example_inputs=torch.randn(1, 3, 6, 6))
    assert result.report.numerics is None and result.report.notes


# --- the oracle and end to end ------------------------------------------------------------


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    ctor = getattr(torchvision.models, name)
    return randomize_batchnorm(ctor(weights=None)).eval()


# Differences from upstream on torchvision models, each with its reason: in torch 2.15 upstream's
# clamp fusion never fires (its insert step already folds the create calls its relu/hardtanh
# patterns look for), so upstream keeps every conv's activation; fxmobile fuses them: mobilenet_v2's
# 35 ReLU6 (hardtanh 0..6) and resnet18's 9 ReLUs that follow a conv (the 8 after an add stay).
ORACLE_DIFFERENCES = {
    "mobilenet_v2": {"aten::hardtanh": (0, 35)},
    "resnet18": {"aten::relu": (8, 17)},
}


@pytest.mark.parametrize("name", list(ORACLE_DIFFERENCES))
def test_torchvision_model_matches_the_oracle_eager_and_the_lite_interpreter(
    name: str, tmp_path: Path
) -> None:
    model = _model(name)
    scripted = quietly_script(copy.deepcopy(model))
    x = torch.randn(1, 3, 32, 32)
    result = vulkan(scripted)
    theirs = upstream(scripted)
    assert differences(ops(result.module), ops(theirs)) == ORACLE_DIFFERENCES[name]
    assert set(torch.jit.export_opnames(result.module)) <= set(torch.jit.export_opnames(theirs))
    assert_equivalent(model, result.module, x, rel=1e-4)
    loaded = lite(result, tmp_path / f"{name}_vulkan.ptl")
    with torch.no_grad():
        expected = model(x)
    assert float((loaded(x) - expected).abs().max()) <= 1e-4 * float(expected.abs().max())


def test_resnet18_from_eager_runs_in_the_lite_interpreter(tmp_path: Path) -> None:
    model = _model("resnet18")
    x = torch.randn(1, 3, 64, 64)
    before = copy.deepcopy(model.state_dict())
    result = vulkan(model, example_inputs=x)
    names = {n.split(".")[0] for n in torch.jit.export_opnames(result.module)}
    assert {"vulkan_prepack::run_conv2d_context", "vulkan_prepack::run_linear_context"} <= names
    banned = {"aten::conv2d", "aten::linear", "aten::batch_norm", "aten::dropout"}
    assert not names & banned and not [n for n in names if "create_" in n]
    assert ops(result.module)["aten::relu"] == 8  # the 9 after a conv fused; those after an add not
    loaded = lite(result, tmp_path / "resnet18_vulkan.ptl")
    with torch.no_grad():
        expected = model(x)
    assert float((loaded(x) - expected).abs().max()) <= 1e-4 * float(expected.abs().max())
    assert result.report.numerics_passed
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


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
        return self.fc(F.relu(self.bn(self.conv(x))).mean((2, 3)))


def test_preserved_method_is_rewritten_and_transferred() -> None:
    model = WithExport()
    randomize_batchnorm(model).eval()
    scripted = quietly_script(model)
    x = torch.randn(1, 3, 8, 8)
    result = vulkan(scripted, preserved_methods=["features"])
    hist = ops(result.module, "features")
    assert hist["vulkan_prepack::run_conv2d_context"] == 1
    assert hist["vulkan_prepack::run_linear_context"] == 1
    assert "aten::relu" not in hist and "aten::batch_norm" not in hist
    torch.testing.assert_close(result.module.features(x), model.features(x), rtol=1e-5, atol=1e-5)
    assert_equivalent(model, result.module, x)
    # upstream fuses clamps into forward only (and, in torch 2.15, not at all)
    theirs = upstream(scripted, preserved=["features"])
    assert differences(hist, ops(theirs, "features")) == {"aten::relu": (0, 1)}
    # upstream moves the first method's tensors only; fxmobile every rewritten method's
    moved = vulkan(scripted, frozenset(), preserved_methods=["features"])
    assert ops(moved.module, "features")["aten::to"] == 2
    assert (
        ops(upstream(scripted, transfer=True, preserved=["features"]), "features")["aten::to"] == 0
    )


def test_bundled_inputs_survive() -> None:
    model = randomize_batchnorm(WithExport()).eval()
    scripted = quietly_script(model)
    torch.utils.bundled_inputs.augment_model_with_bundled_inputs(
        scripted, [(torch.utils.bundled_inputs.bundle_randn(1, 3, 8, 8),)]
    )
    optimized = fxmobile.optimize_for_mobile(scripted, {GPU_TRANSFER}, backend="vulkan")
    assert optimized.get_num_bundled_inputs() == 1
    inputs = optimized.get_all_bundled_inputs()
    torch.testing.assert_close(optimized(*inputs[0]), model(*inputs[0]), rtol=1e-5, atol=1e-5)
    assert "vulkan_prepack::run_conv2d_context" in ops(optimized)
    moved = fxmobile.optimize_for_mobile(scripted, backend="vulkan")
    assert moved.get_num_bundled_inputs() == 1 and ops(moved)["aten::to"] == 2
