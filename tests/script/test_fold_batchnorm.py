"""fold_batchnorm: a BatchNorm folded into the conv, transposed conv or linear before it, in the
frozen graph.

    batch_norm(producer(x, W, b))  ->  producer(x, W', b')   W' = W * s,  b' = b * s + t

Counts of ``aten::batch_norm`` (gone) and of the producers (kept), numerics against a float64
eager reference with random BatchNorm statistics, and what is left alone with its reason: a
producer whose output is read elsewhere or by two BatchNorms, a rank that is unknown or not the
producer's channels, something else before it, training mode. End to end, the idioms that
reached the TorchScript stage with their BatchNorms on the scripted and eager routes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxmobile
from fxmobile.script.batchnorm import batchnorms as batchnorms_of
from fxmobile.script.batchnorm import input_ranks
from fxmobile.script.fold_batchnorm import FoldBatchNorm
from fxmobile.script.graph_utils import op_histogram
from fxmobile.script.quiet_script import quietly_script
from tests.helpers import assert_equivalent, randomize_batchnorm
from tests.script.common import CTX as NO_INPUTS
from tests.script.common import constant_tensor, frozen, kinds, with_inputs


def batchnorms(module: torch.jit.ScriptModule) -> int:
    return kinds(module)["aten::batch_norm"]


@pytest.mark.parametrize(
    "producer,bn,shape",
    [
        (nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4), (2, 3, 9)),
        (nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), (2, 3, 9, 9)),
        (nn.Conv3d(3, 4, 3), nn.BatchNorm3d(4), (1, 3, 5, 5, 5)),
        (nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), nn.BatchNorm2d(6), (1, 4, 5, 5)),
    ],
    ids=["conv1d", "conv2d", "conv3d", "conv_transpose2d-groups"],
)
def test_a_batchnorm_after_a_convolution_folds_without_example_inputs(
    producer: nn.Module, bn: nn.Module, shape: tuple[int, ...]
) -> None:
    # a convolution's output rank is the one TorchScript's peephole optimizer already assumes;
    # a transposed one's comes from the rank check BatchNorm2d's forward leaves in the graph
    model = randomize_batchnorm(nn.Sequential(producer, bn)).eval()
    x = torch.randn(shape)
    result = FoldBatchNorm().call(frozen(model), NO_INPUTS)
    assert (result.rewrites, batchnorms(result.unit)) == (1, 0)
    assert_equivalent(model, result.unit, x)


class FunctionalBatchNorm(nn.Module):
    """A BatchNorm with no rank check, after a transposed conv (whose rank nothing fixes)."""

    if TYPE_CHECKING:  # buffers, for mypy; TorchScript cannot read string annotations
        mean: torch.Tensor
        var: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 3)
        self.register_buffer("mean", torch.randn(6))
        self.register_buffer("var", torch.rand(6) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(self.up(x), self.mean, self.var)


def test_a_batchnorm_of_unknown_rank_folds_only_with_example_inputs() -> None:
    model = FunctionalBatchNorm().eval()
    x = torch.randn(1, 4, 5, 5)
    unknown = FoldBatchNorm().call(frozen(model), NO_INPUTS)
    assert unknown.rewrites == 0
    assert unknown.skips == {"BN input rank unknown (pass example_inputs)": 1}
    known = FoldBatchNorm().call(frozen(model), with_inputs(x))
    assert (known.rewrites, batchnorms(known.unit)) == (1, 0)
    assert_equivalent(model, known.unit, x)


class SharedConv(nn.Module):
    """One conv module feeding two BatchNorms: torch's module-level fold folds both into the
    one conv (upstream's optimize_for_mobile returns wrong numbers for it). Freezing merges the
    two calls into one conv read by both."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.bn2 = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) + self.bn2(self.conv(x))


def test_a_conv_module_feeding_two_batchnorms_keeps_its_numerics() -> None:
    model = randomize_batchnorm(SharedConv()).eval()
    x = torch.randn(1, 3, 8, 8)
    result = FoldBatchNorm().call(frozen(model), NO_INPUTS)
    assert result.rewrites == 0
    assert result.skips == {"aten::conv2d output has 2 users": 2}
    assert_equivalent(model, result.unit, x)
    optimized = fxmobile.optimize_for_mobile(quietly_script(model))
    assert_equivalent(model, optimized, x)


class ConvReadTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.bn(y) + y


def test_a_conv_whose_output_is_also_read_elsewhere_is_not_folded() -> None:
    model = randomize_batchnorm(ConvReadTwice()).eval()
    result = FoldBatchNorm().call(frozen(model), NO_INPUTS)
    assert result.rewrites == 0
    assert result.skips == {"aten::conv2d output has 2 users": 1}


def test_a_linear_batchnorm_folds_only_when_the_example_shows_a_2d_output() -> None:
    model = randomize_batchnorm(nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4))).eval()
    x = torch.randn(3, 5)
    unknown = FoldBatchNorm().call(frozen(model), NO_INPUTS)
    assert unknown.skips == {"BN input rank unknown (pass example_inputs)": 1}
    known = FoldBatchNorm().call(frozen(model), with_inputs(x))
    assert (known.rewrites, batchnorms(known.unit)) == (1, 0)
    assert_equivalent(model, known.unit, x)


def test_a_linear_batchnorm_on_a_3d_output_is_not_folded() -> None:
    # BatchNorm1d on [N, L, C]-shaped linear output normalizes dim 1 (L), not the features
    model = randomize_batchnorm(nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4))).eval()
    x = torch.randn(2, 4, 5)
    result = FoldBatchNorm().call(frozen(model), with_inputs(x))
    assert result.rewrites == 0
    assert result.skips == {"aten::linear output is 3-D: BN normalizes dim 1, not its channels": 1}


def test_a_batchnorm_without_affine_parameters_folds() -> None:
    model = randomize_batchnorm(
        nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, affine=False))
    ).eval()
    result = FoldBatchNorm().call(frozen(model), NO_INPUTS)
    assert (result.rewrites, batchnorms(result.unit), kinds(result.unit)["aten::conv2d"]) == (
        1,
        0,
        1,
    )
    assert_equivalent(model, result.unit, torch.randn(2, 3, 4, 4))


def test_a_batchnorm_after_something_else_is_left_to_decompose() -> None:
    model = randomize_batchnorm(nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.BatchNorm2d(4)))
    result = FoldBatchNorm().call(frozen(model.eval()), NO_INPUTS)
    assert result.rewrites == 0
    assert result.skips == {"BN input comes from aten::relu, not a conv or linear": 1}
    assert batchnorms(result.unit) == 1


def test_each_folded_batchnorm_of_a_model_counts_once() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)
    )
    model = randomize_batchnorm(model).eval()
    x = torch.randn(1, 3, 6, 6)
    result = FoldBatchNorm().call(frozen(model), NO_INPUTS)
    assert (result.rewrites, batchnorms(result.unit), kinds(result.unit)["aten::conv2d"]) == (
        2,
        0,
        2,
    )
    assert_equivalent(model, result.unit, x)


def test_the_folded_weight_keeps_the_producers_dtype() -> None:
    model = randomize_batchnorm(nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))).eval()
    model = model.double()
    result = FoldBatchNorm().call(frozen(model), NO_INPUTS)
    (conv,) = [n for n in result.unit.graph.nodes() if n.kind() == "aten::conv2d"]
    assert constant_tensor(conv.inputsAt(1)).dtype == torch.float64
    assert constant_tensor(conv.inputsAt(2)).dtype == torch.float64
    x = torch.randn(1, 3, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(result.unit(x), model(x), rtol=1e-12, atol=1e-12)


class FunctionalTrainingBatchNorm(nn.Module):
    if TYPE_CHECKING:  # buffers, for mypy; TorchScript cannot read string annotations
        mean: torch.Tensor
        var: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(self.conv(x), self.mean, self.var, training=True)


def test_a_batchnorm_in_training_mode_is_left_alone() -> None:
    model = FunctionalTrainingBatchNorm().eval()
    module = frozen(model)
    reason = {"BN in training mode, or its training flag is not a constant": 1}
    assert FoldBatchNorm().call(module, NO_INPUTS).skips == reason
    assert batchnorms(module) == 1


class StatisticsFromTheInput(nn.Module):
    """A BatchNorm one of whose statistics, affine parameters or eps the input changes: no fold
    may take it for a constant (nor a missing weight for none)."""

    if TYPE_CHECKING:  # buffers, for mypy; TorchScript cannot read string annotations
        mean: torch.Tensor
        var: torch.Tensor

    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which
        self.conv = nn.Conv2d(3, 4, 3)
        self.weight = nn.Parameter(torch.rand(4) + 0.5)
        self.bias = nn.Parameter(torch.randn(4))
        self.register_buffer("mean", torch.randn(4))
        self.register_buffer("var", torch.rand(4) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        moved = x.mean().abs() + 1
        var: torch.Tensor = self.var
        weight: torch.Tensor = self.weight
        eps = 1e-5
        if self.which == "var":
            var = self.var * moved
        if self.which == "weight":
            weight = self.weight * moved
        if self.which == "eps":
            eps = float(moved) * 1e-5
        return F.batch_norm(y, self.mean, var, weight, self.bias, eps=eps)


@pytest.mark.parametrize(
    "which,reason",
    [
        ("var", "BN has no constant running stats"),
        ("weight", "BN affine params are not constants"),
        ("eps", "BN eps is not a constant"),
    ],
)
def test_statistics_the_input_changes_are_left_alone(which: str, reason: str) -> None:
    model = StatisticsFromTheInput(which).eval()
    x = torch.randn(1, 3, 8, 8)
    result = FoldBatchNorm().call(frozen(model), with_inputs(x))
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert_equivalent(model, result.unit, x)


class WeightFromTheInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.b = nn.Parameter(torch.randn(4))
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(F.conv2d(x, self.w * x.mean(), self.b))


def test_a_conv_whose_weight_the_input_changes_is_not_folded() -> None:
    model = randomize_batchnorm(WeightFromTheInput()).eval()
    x = torch.randn(1, 3, 8, 8)
    result = FoldBatchNorm().call(frozen(model), NO_INPUTS)
    assert (result.rewrites, result.skips) == (
        0,
        {"aten::conv2d weight or bias is not a constant": 1},
    )
    assert_equivalent(model, result.unit, x)


def test_the_fold_is_computed_in_float64() -> None:
    module = frozen(randomize_batchnorm(nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))))
    (bn,) = [b for _, b in batchnorms_of(module, ["forward"]) if not isinstance(b, str)]
    s, t = bn.scale_shift()
    assert s.dtype == t.dtype == torch.float64
    var, mean = bn.var.double(), bn.mean.double()
    assert bn.gamma is not None and bn.beta is not None
    expected = bn.gamma.double() / torch.sqrt(var + bn.eps)
    assert torch.equal(s, expected) and torch.equal(t, bn.beta.double() - mean * expected)


class CheckedRank(nn.Module):
    """A transposed conv's output, whose rank a check proves (constant on the left), or that a
    check against another tensor's rank does not."""

    if TYPE_CHECKING:  # buffers, for mypy; TorchScript cannot read string annotations
        mean: torch.Tensor
        var: torch.Tensor

    def __init__(self, against_input: bool) -> None:
        super().__init__()
        self.against_input = against_input
        self.up = nn.ConvTranspose2d(4, 6, 3)
        self.register_buffer("mean", torch.randn(6))
        self.register_buffer("var", torch.rand(6) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(x)
        expected = x.dim() if self.against_input else 4
        if expected != y.dim():
            raise ValueError("expected a 4-D input")
        return F.batch_norm(y, self.mean, self.var)


@pytest.mark.parametrize(
    "against_input,rewrites,skips",
    [(False, 1, {}), (True, 0, {"BN input rank unknown (pass example_inputs)": 1})],
)
def test_a_rank_check_proves_the_rank_only_against_a_constant(
    against_input: bool, rewrites: int, skips: dict[str, int]
) -> None:
    model = CheckedRank(against_input).eval()
    result = FoldBatchNorm().call(frozen(model), NO_INPUTS)
    assert (result.rewrites, result.skips) == (rewrites, skips)
    assert_equivalent(model, result.unit, torch.randn(1, 4, 5, 5))


class SeveralRankChecks(nn.Module):
    """A transposed conv's output whose rank ``d`` is compared three times: by ``<`` (not
    ``!=``), by ``!=`` against another tensor's rank, and last by ``!=`` against 4, the check that
    proves it."""

    if TYPE_CHECKING:
        mean: torch.Tensor
        var: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 3)
        self.register_buffer("mean", torch.randn(6))
        self.register_buffer("var", torch.rand(6) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(x)
        d = y.dim()
        if d < 3:
            raise ValueError("expected a batched input")
        if d != x.dim():
            raise ValueError("expected the input's rank")
        if d != 4:
            raise ValueError("expected a 4-D input")
        return F.batch_norm(y, self.mean, self.var)


def test_the_rank_check_is_found_among_other_comparisons_of_the_rank() -> None:
    model = SeveralRankChecks().eval()
    result = FoldBatchNorm().call(frozen(model), NO_INPUTS)
    assert (result.rewrites, result.skips) == (1, {})
    assert batchnorms(result.unit) == 0
    assert_equivalent(model, result.unit, torch.randn(1, 4, 5, 5))


class ReadBeforeItsRankCheck(nn.Module):
    """A transposed conv's output read by ``relu`` before its rank check and its BatchNorm."""

    if TYPE_CHECKING:
        mean: torch.Tensor
        var: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 3)
        self.register_buffer("mean", torch.randn(6))
        self.register_buffer("var", torch.rand(6) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(x)
        z = torch.relu(y)
        if y.dim() != 4:
            raise ValueError("expected a 4-D input")
        return F.batch_norm(y, self.mean, self.var) + z


def test_a_rank_check_counts_when_the_batchnorm_input_has_other_readers() -> None:
    """The fold refuses this BatchNorm (its input has two readers) before it needs the rank; the
    decomposition (which takes it) gets the rank from ``input_ranks``, checked here directly."""
    module = frozen(ReadBeforeItsRankCheck().eval())
    (bn,) = [b for _, b in batchnorms_of(module, ["forward"])]
    assert not isinstance(bn, str)
    assert next(u.user.kind() for u in bn.input.uses()) == "aten::relu"  # read first by relu
    assert input_ranks(module, NO_INPUTS) == {bn.input: 4}


# --- end to end: the routes the FX stage's fold never sees ----------------------------------


class StaticSamePaddingConv(nn.Conv2d):
    """EfficientNet-PyTorch's pattern: a conv subclass with its own forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.pad(x, [1, 1, 1, 1]), self.weight, self.bias, self.stride)


class BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d pattern: a BatchNorm subclass that also activates."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
        )
        return torch.relu(x)


class Separable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pointwise = nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


class Idioms(nn.Module):
    """The three idioms that kept BatchNorms in zoo models on the TorchScript route."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = StaticSamePaddingConv(3, 8, 3)
        self.bn0 = nn.BatchNorm2d(8)
        self.sep = Separable()
        self.bn1 = nn.BatchNorm2d(8)  # a sibling of the module whose last call is the conv
        self.conv = nn.Conv2d(8, 8, 1)
        self.bn2 = BatchNormAct(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv(self.bn1(self.sep(self.bn0(self.stem(x))))))


@pytest.mark.parametrize("route", ["scripted", "eager"])
def test_no_batchnorm_reaches_the_mobile_graph_in_any_idiom(route: str) -> None:
    model = randomize_batchnorm(Idioms()).eval()
    x = torch.randn(1, 3, 10, 10)
    given = quietly_script(model) if route == "scripted" else model
    result = fxmobile.optimize(given, example_inputs=x)
    hist = op_histogram(result.module, ["forward"])
    assert "aten::batch_norm" not in hist
    assert hist["prepacked::conv2d_clamp_run"] == 4
    assert_equivalent(model, result.module, x)
