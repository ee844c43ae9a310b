"""DecomposeBatchNorm: an inference BatchNorm left after folding -> x * s + t."""

from __future__ import annotations

import copy
import operator
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from fxmobile.infra import PassResult
from fxmobile.passes.decompose_batchnorm import DecomposeBatchNorm
from fxmobile.passes.stage import FxContext
from tests.helpers import (
    assert_equivalent,
    count_calls,
    count_modules,
    randomize_batchnorm,
    run_fx_passes,
)

C = 5
BN_TYPES: dict[int, type[nn.modules.batchnorm._BatchNorm]] = {
    1: nn.BatchNorm1d,
    2: nn.BatchNorm2d,
    3: nn.BatchNorm3d,
}


def run(model: nn.Module, *inputs: torch.Tensor, shapes: bool) -> tuple[fx.GraphModule, PassResult]:
    """Trace ``model`` and run the pass; through the manager with shapes when ``shapes``."""
    gm = fx.symbolic_trace(model)
    if not shapes:
        result = DecomposeBatchNorm().call(gm, FxContext())
        gm.graph.lint()
        gm.recompile()
        return gm, result
    gm, records = run_fx_passes(gm, [DecomposeBatchNorm()], inputs)
    (record,) = records
    return gm, PassResult(gm, record.rewrites, record.skips)


def bn_model(bn: nn.Module) -> nn.Module:
    """BN between two ops that cannot take it (no producer to fold into)."""
    return randomize_batchnorm(nn.Sequential(nn.ReLU(), bn, nn.Tanh())).eval()


def count_batch_norms(gm: fx.GraphModule) -> int:
    modules = sum(count_modules(gm, t) for t in BN_TYPES.values())
    return modules + count_calls(gm, F.batch_norm) + count_calls(gm, torch.batch_norm)


def buffer_shapes(gm: fx.GraphModule) -> set[tuple[int, ...]]:
    return {tuple(b.shape) for b in gm.buffers()}


# --- module form -------------------------------------------------------------------------------

# (BN dims, input shape, buffer shape with shapes known)
CASES = {
    "BatchNorm1d [N, C]": (1, (4, C), (C,)),
    "BatchNorm1d [N, C, L]": (1, (4, C, 7), (C, 1)),
    "BatchNorm2d": (2, (2, C, 6, 6), (C, 1, 1)),
    "BatchNorm3d": (3, (2, C, 3, 4, 5), (C, 1, 1, 1)),
}


@pytest.mark.parametrize("shapes", [True, False], ids=["shapes", "no_shapes"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
@pytest.mark.parametrize("case", CASES)
def test_module_batchnorm_decomposes(case: str, affine: bool, shapes: bool) -> None:
    dims, input_shape, buffer_shape = CASES[case]
    model = bn_model(BN_TYPES[dims](C, eps=1e-3, affine=affine))
    reference, x = copy.deepcopy(model), torch.randn(input_shape)
    gm, result = run(model, x, shapes=shapes)
    assert (result.rewrites, result.skips) == (1, {})
    assert count_batch_norms(gm) == 0
    assert count_calls(gm, operator.mul) == 1 and count_calls(gm, operator.add) == 1
    rank_known = shapes or dims > 1
    # Without shapes BatchNorm1d gets the form that is right for [N, C] and [N, C, L] alike.
    assert count_calls(gm, "view_as") == (0 if rank_known else 1)
    assert buffer_shapes(gm) == {buffer_shape if rank_known else (C, 1)}
    assert_equivalent(reference, gm, x)


@pytest.mark.parametrize("input_shape", [(4, C), (4, C, 7)], ids=str)
def test_rank_agnostic_form_scripts(input_shape: tuple[int, ...]) -> None:
    model = bn_model(nn.BatchNorm1d(C))
    gm, result = run(model, shapes=False)
    assert result.rewrites == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(gm)
    x = torch.randn(input_shape)
    assert_equivalent(model, scripted, x)
    assert_equivalent(model, gm, x.transpose(0, -1).contiguous().transpose(0, -1))  # strided


def test_keeps_dtype() -> None:
    model = bn_model(nn.BatchNorm2d(C)).double()
    x = torch.randn(2, C, 4, 4, dtype=torch.float64)
    gm, result = run(model, x, shapes=True)
    assert result.rewrites == 1
    assert {b.dtype for b in gm.buffers()} == {torch.float64}
    assert gm(x).dtype == torch.float64
    assert_equivalent(model, gm, x, rel=1e-12)


def test_shared_batchnorm_stores_its_constants_once() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm2d(C)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(x) + self.bn(x.flip(-1))

    model = randomize_batchnorm(Shared()).eval()
    reference, x = copy.deepcopy(model), torch.randn(2, C, 3, 3)
    gm, result = run(model, x, shapes=True)
    assert (result.rewrites, result.skips) == (2, {})
    assert count_batch_norms(gm) == 0
    assert sorted(name for name, _ in gm.named_buffers()) == ["bn_scale", "bn_shift"]
    assert_equivalent(reference, gm, x)


def test_chained_functional_batchnorm_knows_its_rank_after_a_decomposed_one() -> None:
    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.BatchNorm1d(C)
            self.b = nn.BatchNorm1d(C)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.a(x)
            return F.batch_norm(y, self.b.running_mean, self.b.running_var, self.b.weight)

    model = randomize_batchnorm(Chain()).eval()
    reference, x = copy.deepcopy(model), torch.randn(3, C, 4)
    gm, result = run(model, x, shapes=True)
    assert (result.rewrites, result.skips) == (2, {})
    assert count_calls(gm, "view_as") == 0
    assert buffer_shapes(gm) == {(C, 1)}
    assert_equivalent(reference, gm, x)


# --- functional form ---------------------------------------------------------------------------


class Functional(nn.Module):
    mean: torch.Tensor
    var: torch.Tensor

    def __init__(self, affine: bool, torch_op: bool = False, training: bool = False) -> None:
        super().__init__()
        self.torch_op, self.training_arg = torch_op, training
        self.register_buffer("mean", torch.randn(C))
        self.register_buffer("var", torch.rand(C) + 0.2)
        self.w = nn.Parameter(torch.randn(C)) if affine else None
        self.b = nn.Parameter(torch.randn(C)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.torch_op:
            return torch.batch_norm(
                x, self.w, self.b, self.mean, self.var, self.training_arg, 0.1, 1e-4, False
            )
        return F.batch_norm(x, self.mean, self.var, self.w, self.b, self.training_arg, eps=1e-4)


@pytest.mark.parametrize("torch_op", [False, True], ids=["F.batch_norm", "torch.batch_norm"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
@pytest.mark.parametrize("shapes", [True, False], ids=["shapes", "no_shapes"])
def test_functional_batchnorm_decomposes(torch_op: bool, affine: bool, shapes: bool) -> None:
    model = Functional(affine, torch_op).eval()
    reference, x = copy.deepcopy(model), torch.randn(2, C, 3, 4)
    gm, result = run(model, x, shapes=shapes)
    assert (result.rewrites, result.skips) == (1, {})
    assert count_batch_norms(gm) == 0
    assert buffer_shapes(gm) == {(C, 1, 1) if shapes else (C, 1)}
    assert_equivalent(reference, gm, x)


# --- left alone, with the reason ---------------------------------------------------------------


def test_batchnorm_without_running_stats_is_left_alone() -> None:
    model = bn_model(nn.BatchNorm2d(C, track_running_stats=False))
    x = torch.randn(3, C, 4, 4)
    gm, result = run(model, x, shapes=True)
    assert (result.rewrites, result.skips) == (0, {"BN has no running stats": 1})
    assert count_modules(gm, nn.BatchNorm2d) == 1
    assert_equivalent(model, gm, x)  # normalized by the batch statistics, as in eager


def test_batchnorm_in_training_mode_is_left_alone() -> None:
    model = bn_model(nn.BatchNorm2d(C)).train()
    gm, result = run(model, shapes=False)
    assert (result.rewrites, result.skips) == (0, {"BN in training mode": 1})
    assert count_modules(gm, nn.BatchNorm2d) == 1


@pytest.mark.parametrize("torch_op", [False, True], ids=["F.batch_norm", "torch.batch_norm"])
def test_functional_batchnorm_in_training_is_left_alone(torch_op: bool) -> None:
    model = Functional(affine=True, torch_op=torch_op, training=True).eval()
    x = torch.randn(2, C, 3, 4)
    gm, result = run(model, x, shapes=True)
    assert (result.rewrites, result.skips) == (0, {"BN in training mode": 1})
    assert count_batch_norms(gm) == 1


def test_functional_batchnorm_with_computed_stats_is_left_alone() -> None:
    class Computed(Functional):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # Statistics computed from the input; note ``self.var.abs()`` would not do: the
            # tracer computes it once and stores it as a get_attr constant.
            return F.batch_norm(x, x.mean(dim=(0, 2)), self.var, self.w, self.b)

    model = Computed(affine=True).eval()
    x = torch.randn(2, C, 3)
    gm, result = run(model, x, shapes=True)
    reason = "BN stats or affine params are not constants"
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert count_batch_norms(gm) == 1
    assert_equivalent(model, gm, x)


def test_mixed_precision_batchnorm_is_left_alone() -> None:
    # batch_norm takes a float16 input with float32 statistics and returns float16;
    # x * s + t with float32 s and t would return float32.
    model = bn_model(nn.BatchNorm2d(C))
    x = torch.randn(2, C, 4, 4, dtype=torch.float16)
    gm, result = run(model, x, shapes=True)
    reason = "BN input dtype torch.float16 differs from its statistics' torch.float32"
    assert (result.rewrites, result.skips) == (0, {reason: 1})
    assert gm(x).dtype == torch.float16


def test_subclassed_batchnorm_is_left_alone_with_the_reason() -> None:
    class MyBN(nn.BatchNorm2d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    model = bn_model(MyBN(C))

    class MyBNLeaf(fx.Tracer):
        def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
            return isinstance(m, MyBN)

    gm = fx.GraphModule(model, MyBNLeaf().trace(model))
    result = DecomposeBatchNorm().call(gm, FxContext())
    assert (result.rewrites, result.skips) == (0, {"BN subclass MyBN may override forward": 1})


def test_a_refused_batchnorm_does_not_stop_the_ones_after_it() -> None:
    # the first BN has a hook (left alone), the second is decomposed all the same
    hooked = nn.BatchNorm2d(C)
    hooked.register_forward_hook(lambda m, i, o: o.abs())
    model = randomize_batchnorm(nn.Sequential(hooked, nn.Tanh(), nn.BatchNorm2d(C))).eval()
    reference, x = copy.deepcopy(model), torch.randn(2, C, 3, 3)

    gm, result = run(model, x, shapes=True)

    assert (result.rewrites, result.skips) == (1, {"BatchNorm2d has forward hooks": 1})
    assert count_batch_norms(gm) == 1
    assert_equivalent(reference, gm, x)


# --- end to end through the manager ------------------------------------------------------------


def test_end_to_end_through_pass_manager() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, C, 3)
            self.bn2 = nn.BatchNorm2d(C)
            self.bn1 = nn.BatchNorm1d(C)
            self.stats_free = nn.BatchNorm1d(C, track_running_stats=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.bn2(self.conv(x).relu())
            z = self.bn1(y.mean(dim=(2, 3)))
            return self.stats_free(z) + y.flatten(2).mean(-1)

    model = randomize_batchnorm(Net()).eval()
    reference, x = copy.deepcopy(model), torch.randn(4, 3, 8, 8)
    gm = fx.symbolic_trace(model)
    gm, records = run_fx_passes(gm, [DecomposeBatchNorm()], (x,))
    assert [(r.name, r.rewrites, r.skips) for r in records] == [
        ("decompose_batchnorm", 2, {"BN has no running stats": 1})
    ]
    assert count_modules(gm, nn.BatchNorm2d) == 0 and count_modules(gm, nn.BatchNorm1d) == 1
    assert buffer_shapes(gm) >= {(C, 1, 1), (C,)}
    for _ in range(2):  # run the optimized model more than once (pytorch#52463)
        assert_equivalent(reference, gm, x)
