"""FoldConstants: constant subgraphs become buffers; random, in-place and mutated ones stay."""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from fxmobile.infra import PassResult
from fxmobile.passes.constant_guard import MUTATES, ConstantGuard, NotConstantError, storages
from fxmobile.passes.fold_constants import (
    INPLACE,
    RANDOM,
    STATS,
    UNINITIALIZED,
    FoldConstants,
)
from fxmobile.passes.stage import FxContext
from tests.helpers import (
    assert_equivalent,
    count_calls,
    count_modules,
    run_fx_passes,
    trace_keeping,
)


def _fold(model: nn.Module) -> tuple[fx.GraphModule, PassResult]:
    gm = fx.symbolic_trace(copy.deepcopy(model))
    result = FoldConstants().call(gm, FxContext())
    gm.graph.lint()
    gm.recompile()
    return gm, result


def _folded_buffers(gm: fx.GraphModule) -> list[str]:
    """Targets of get_attr nodes reading a buffer the pass created."""
    names = {name for name, _ in gm.named_buffers()}
    return [
        str(n.target)
        for n in gm.graph.nodes
        if n.op == "get_attr" and str(n.target).startswith("_folded_") and n.target in names
    ]


class ConvScaled(nn.Module):
    """F.conv2d(x, w * scale, b.repeat(1)): the example from the pass's docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.scale = nn.Parameter(torch.rand(4, 1, 1, 1) + 0.5)
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.w * self.scale, self.b.repeat(1))


class LinearTransposed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 5))
        self.scale = nn.Parameter(torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.weight.t() * self.scale) + self.scale.sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conv_weight_arithmetic_is_folded(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = ConvScaled().to(dtype).eval()
    x = torch.randn(2, 3, 8, 8, dtype=dtype)
    assert count_calls(fx.symbolic_trace(model), operator.mul) == 1
    gm, result = _fold(model)
    assert result.rewrites == 2 and result.modified
    assert count_calls(gm, operator.mul) == 0 and count_calls(gm, "repeat") == 0
    assert count_calls(gm, torch.conv2d) == 1
    assert len(_folded_buffers(gm)) == 2
    # the parameters the fold consumed are gone; the buffers keep the graph's dtype
    assert not any(True for _ in gm.parameters())
    assert all(b.dtype == dtype for b in gm.buffers())
    assert_equivalent(model, gm, x)
    with torch.no_grad():  # evaluated exactly as the graph would: bit for bit
        assert torch.equal(gm(x), model(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transposed_weight_folded_in_graph_dtype(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = LinearTransposed().to(dtype).eval()
    x = torch.randn(3, 5, dtype=dtype)
    gm, result = _fold(model)
    # weight.t() * scale and scale.sum(): two subgraph outputs; scale.sum() also reads scale
    assert result.rewrites == 2
    assert count_calls(gm, "t") == 0 and count_calls(gm, "sum") == 0
    assert [b.dtype for b in gm.buffers()] == [dtype, dtype]
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))
    if dtype is torch.float32:
        assert_equivalent(model, gm, x)


def _graph_module(build: object) -> fx.GraphModule:
    """A hand-built graph (symbolic tracing runs factory calls with constant args eagerly)."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x))  # type: ignore[operator]
    return fx.GraphModule(nn.Module(), graph)


def test_factory_call_with_constant_args_is_folded() -> None:
    def build(g: fx.Graph, x: fx.Node) -> fx.Node:
        ones = g.call_function(torch.ones, (3,))
        two = g.call_function(operator.mul, (ones, 2))
        return g.call_function(operator.add, (x, two))

    gm = _graph_module(build)
    x = torch.randn(2, 3)
    result = FoldConstants().call(gm, FxContext())
    gm.recompile()
    assert result.rewrites == 1
    assert count_calls(gm, torch.ones) == 0 and count_calls(gm, operator.mul) == 0
    assert len(_folded_buffers(gm)) == 1
    assert torch.equal(gm(x), x + torch.ones(3) * 2)


@pytest.mark.parametrize(
    ("factory", "reason"),
    [(torch.rand, RANDOM), (torch.randn, RANDOM), (torch.empty, UNINITIALIZED)],
)
def test_random_and_uninitialized_factories_untouched(factory: object, reason: str) -> None:
    def build(g: fx.Graph, x: fx.Node) -> fx.Node:
        made = g.call_function(factory, (3,))  # type: ignore[arg-type]
        return g.call_function(operator.add, (x, made))

    gm = _graph_module(build)
    state = torch.get_rng_state()
    result = FoldConstants().call(gm, FxContext())
    assert result.rewrites == 0 and not result.modified
    assert result.skips == {reason: 1}
    assert count_calls(gm, factory) == 1
    assert torch.equal(torch.get_rng_state(), state)  # never evaluated


class RandomOfConstant(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(4))
        self.kind = kind
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w * 0.5  # constant: folded; the random op on it is not
        if self.kind == "rand_like":
            noise = torch.rand_like(w)
        elif self.kind == "bernoulli":
            noise = w.bernoulli()
        elif self.kind == "dropout":
            noise = F.dropout(w, 0.5)  # training=True by default: random even in eval
        else:
            noise = self.drop(w)  # module left in training mode below
        return x + noise


@pytest.mark.parametrize("kind", ["rand_like", "bernoulli", "dropout", "dropout_module"])
def test_random_ops_on_constants_untouched(kind: str) -> None:
    model = RandomOfConstant(kind).eval()
    if kind == "dropout_module":
        model.drop.train()
    gm = fx.symbolic_trace(copy.deepcopy(model))
    state = torch.get_rng_state()
    result = FoldConstants().call(gm, FxContext())
    gm.recompile()
    assert torch.equal(torch.get_rng_state(), state)
    assert result.rewrites == 1  # only w * 0.5
    assert count_calls(gm, operator.mul) == 0
    (reason,) = result.skips
    assert "random" in reason or "training" in reason
    if kind == "dropout_module":
        assert count_modules(gm, nn.Dropout) == 1
    else:
        target = {"rand_like": torch.rand_like, "bernoulli": "bernoulli", "dropout": F.dropout}
        assert count_calls(gm, target[kind]) == 1
    x = torch.randn(4)
    torch.manual_seed(1)
    expected = model(x)
    torch.manual_seed(1)
    assert torch.equal(gm(x), expected)


class RReLUOfConstant(nn.Module):
    """F.rrelu(training=True) is in no list: the dispatch guard refuses its seeded aten op."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.rrelu(self.w, training=True)


def test_guard_refuses_unlisted_random_op_before_it_runs() -> None:
    model = RReLUOfConstant().eval()
    state = torch.get_rng_state()
    gm, result = _fold(model)
    assert torch.equal(torch.get_rng_state(), state)
    assert result.rewrites == 0 and result.skips == {RANDOM: 1}
    assert count_calls(gm, F.rrelu) == 1


class StatsUpdate(nn.Module):
    """Batch norm in training mode writes running stats that other constants read."""

    def __init__(self, functional: bool) -> None:
        super().__init__()
        self.functional = functional
        self.w = nn.Parameter(torch.randn(4, 3))
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.functional:  # constant inputs, but it writes running stats: never evaluated
            normed = F.batch_norm(self.w, self.bn.running_mean, self.bn.running_var, training=True)
        else:  # x input: never evaluated; a training BN module counts as writing its buffers
            normed = self.bn(x)
        return x + normed + self.bn.get_buffer("running_mean") * 2


class _BufferTracer(fx.Tracer):
    proxy_buffer_attributes = True  # running_mean * 2 becomes a get_attr, not a traced value


@pytest.mark.parametrize("functional", [True, False])
def test_running_stats_updated_in_forward_are_not_folded(functional: bool) -> None:
    model = StatsUpdate(functional).train()
    copied = copy.deepcopy(model)
    gm = fx.GraphModule(copied, _BufferTracer().trace(copied))
    result = FoldConstants().call(gm, FxContext())
    gm.recompile()
    assert result.rewrites == 0
    assert count_calls(gm, operator.mul) == 1
    assert "constant is mutated in place by the graph" in result.skips
    if functional:
        assert result.skips[STATS] == 1
    assert torch.equal(gm.get_buffer("bn.running_mean"), torch.zeros(3))  # nothing ran
    reference = copy.deepcopy(model)
    x = torch.randn(4, 3)
    for _ in range(3):
        with torch.no_grad():
            assert torch.equal(gm(x), reference(x))


class InplaceOnConstant(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        # a parameter (fx proxies those; a buffer would be read at trace time)
        self.steps = nn.Parameter(torch.zeros(4), requires_grad=False)
        self.act = nn.ReLU(inplace=True)
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "add_":
            w = self.w * 2
            w.add_(1)
            return x + w
        if self.kind == "relu_":
            w = self.w * 2
            torch.relu_(w)
            return x + w
        if self.kind == "inplace_module":
            return x + self.act(self.w * 2)
        # a buffer updated on every call: nothing computed from it is a constant
        self.steps.add_(1)
        return x * (self.steps * 2)


@pytest.mark.parametrize("kind", ["add_", "relu_", "inplace_module", "counter"])
def test_inplace_ops_and_what_they_mutate_untouched(kind: str) -> None:
    model = InplaceOnConstant(kind).eval()
    gm = fx.symbolic_trace(copy.deepcopy(model))
    code = gm.code
    result = FoldConstants().call(gm, FxContext())
    gm.recompile()
    assert result.rewrites == 0 and not result.modified
    assert gm.code == code
    assert INPLACE in result.skips
    assert "constant is mutated in place by the graph" in result.skips
    x = torch.randn(4)
    reference = copy.deepcopy(model)
    for _ in range(3):  # a folded buffer would carry the mutation into the next call
        with torch.no_grad():
            assert torch.equal(gm(x.clone()), reference(x.clone()))


class Opaque(nn.Module):
    """Outside torch.nn: may have state fxmobile cannot see."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.ones(4))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.p.add_(1)
        return t * self.p


class UsesOpaque(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.leaf = Opaque()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.leaf(self.w * 2) + self.leaf.p * 3 + self.w.sum()


def test_opaque_module_is_not_evaluated_and_its_state_not_folded() -> None:
    model = UsesOpaque().eval()
    copied = copy.deepcopy(model)
    gm = trace_keeping(copied, Opaque)
    result = FoldConstants().call(gm, FxContext())
    gm.recompile()
    assert result.skips["module not known to be pure"] == 1
    assert torch.equal(gm.get_parameter("leaf.p"), torch.ones(4))  # the leaf never ran
    # the leaf may write to its argument (w * 2) and to its own p (leaf.p * 3): both stay;
    # w.sum() does not touch either and folds
    assert result.rewrites == 1
    assert count_calls(gm, operator.mul) == 2 and count_calls(gm, "sum") == 0
    x = torch.randn(4)
    reference = copy.deepcopy(model)
    for _ in range(3):
        with torch.no_grad():
            assert torch.equal(gm(x), reference(x))


class Shapes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, self.w.shape[1]) + self.w


def test_non_tensor_results_and_lone_get_attr_untouched() -> None:
    model = Shapes().eval()
    gm, result = _fold(model)
    assert result.rewrites == 0 and not result.modified
    assert result.skips == {"folded result is not a tensor or a tuple of tensors": 2}
    x = torch.randn(3, 2, 2)
    assert torch.equal(gm(x), model(x))


class Expands(nn.Module):
    def __init__(self, rows: int, scaled: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(1, 1024))
        self.rows = rows
        self.scaled = scaled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w * 2 if self.scaled else self.w
        return x + w.expand(self.rows, 1024)


@pytest.mark.parametrize(
    ("rows", "scaled", "rewrites", "skipped"),
    [
        (1024, False, 0, True),  # 4 MiB from 4 KiB: declined
        (1024, True, 1, True),  # declined, but w * 2 below it still folds
        (4, False, 1, False),  # small: folded
    ],
)
def test_growth_limit(rows: int, scaled: bool, rewrites: int, skipped: bool) -> None:
    model = Expands(rows, scaled).eval()
    gm, result = _fold(model)
    assert result.rewrites == rewrites
    assert ("folded result would grow the model" in result.skips) is skipped
    assert count_calls(gm, "expand") == (1 if skipped else 0)
    x = torch.randn(rows, 1024)
    assert torch.equal(gm(x), model(x))


class ReturnsConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, self.w * 2 + 1


def test_constant_model_output_stays_fresh() -> None:
    model = ReturnsConstant().eval()
    gm, result = _fold(model)
    # `w * 2 + 1` is returned: declined; `w * 2` then folds
    assert result.rewrites == 1
    assert result.skips == {"constant returned as a model output": 1}
    x = torch.randn(4)
    first = gm(x)[1]
    assert first is not gm(x)[1]  # a fresh tensor per call, as in eager
    assert_equivalent(model, gm, x)


class Views(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w.float() + self.w[0]


def test_view_is_copied_and_identity_reads_the_attribute() -> None:
    model = Views().eval()
    gm, result = _fold(model)
    assert result.rewrites == 2
    assert count_calls(gm, "float") == 0 and count_calls(gm, operator.getitem) == 0
    # w.float() on a float w *is* w: read from w, no copy; w[0] is copied into a buffer that
    # does not keep w's storage alive
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["w", "_folded_0"]
    view, w = gm.get_buffer("_folded_0"), gm.get_parameter("w")
    assert view.untyped_storage().data_ptr() != w.untyped_storage().data_ptr()
    assert view.untyped_storage().nbytes() == 4 * 4
    x = torch.randn(4)
    assert torch.equal(gm(x), model(x))


def test_view_read_twice_stored_once() -> None:
    class TwoReads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(2, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.w[0] + self.w[0] + self.w[1].float()

    model = TwoReads().eval()
    gm, result = _fold(model)
    assert result.rewrites == 3
    assert len(set(_folded_buffers(gm))) == 2  # w[0] copied once; w[1].float() is w[1]
    assert "w" not in dict(gm.named_parameters())
    x = torch.randn(4)
    assert torch.equal(gm(x), model(x))


@torch.fx.wrap
def first_plus(parts: tuple[torch.Tensor, ...], x: torch.Tensor) -> torch.Tensor:
    return parts[0] + x


class Chunks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return first_plus((self.w * 2).chunk(2), x)


def test_tuple_of_tensors_passed_to_a_user_function_stays() -> None:
    """A ``torch.fx.wrap``-ed user function may write to its arguments (torchvision's mvit
    ``_add_shortcut`` does): folded into buffers, the chunks would carry such a write into the
    next call, so they stay computed."""
    model = Chunks().eval()
    gm, result = _fold(model)
    assert result.rewrites == 0
    assert result.skips == {"constant is mutated in place by the graph": 2}  # w * 2, chunk
    assert count_calls(gm, "chunk") == 1
    x = torch.randn(2, 3)
    assert torch.equal(gm(x), model(x))


class ChunkParts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = (self.w * 2).chunk(2)
        return a + x, b - x


def test_parts_of_a_tuple_result_are_folded_into_their_own_storage() -> None:
    model = ChunkParts().eval()
    gm, result = _fold(model)
    assert result.rewrites >= 1
    assert count_calls(gm, "chunk") == 0
    assert len(_folded_buffers(gm)) == 2
    for name in _folded_buffers(gm):  # each chunk copied out of the (w * 2) storage it views
        chunk = gm.get_buffer(name)
        assert chunk.untyped_storage().nbytes() == chunk.numel() * chunk.element_size()
    x = torch.randn(2, 3)
    for got, expected in zip(gm(x), model(x), strict=True):
        assert torch.equal(got, expected)


def test_graph_without_constants_unchanged() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    gm = fx.symbolic_trace(copy.deepcopy(model))
    code = gm.code
    result = FoldConstants().call(gm, FxContext())
    assert result.rewrites == 0 and not result.modified and result.skips == {}
    assert gm.code == code and count_modules(gm, nn.Conv2d) == 1


def test_end_to_end_through_the_pass_manager() -> None:
    torch.manual_seed(0)
    model = ConvScaled().eval()
    x = torch.randn(1, 3, 8, 8)
    gm = fx.symbolic_trace(copy.deepcopy(model))
    gm, records = run_fx_passes(gm, [FoldConstants()], (x,))
    (record,) = records
    assert record.rewrites == 2 and record.skips == {}
    assert count_calls(gm, operator.mul) == 0
    assert record.param_bytes_after == record.param_bytes_before - 4 * 4  # scale (4 floats) gone
    assert_equivalent(model, gm, x)


# --- the dispatch guard: what no static table sees is refused before it runs ---------------


class GumbelOfConstant(nn.Module):
    """F.gumbel_softmax has no aten op of its own (fxmobile.ops cannot call it random); it
    draws through ``exponential_`` inside, which only the dispatch guard sees."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gumbel_softmax(self.w * 2)


def test_guard_refuses_random_op_inside_a_torch_function() -> None:
    model = GumbelOfConstant().eval()
    state = torch.get_rng_state()
    gm, result = _fold(model)
    assert torch.equal(torch.get_rng_state(), state)  # refused before exponential_ ran
    assert result.rewrites == 1  # w * 2 only
    assert result.skips == {RANDOM: 1}
    assert count_calls(gm, F.gumbel_softmax) == 1 and count_calls(gm, operator.mul) == 0
    x = torch.randn(4)
    torch.manual_seed(3)
    expected = model(x)
    torch.manual_seed(3)
    assert torch.equal(gm(x), expected)


class NativeBatchNorm(nn.Module):
    """``torch.native_batch_norm`` with ``training=True`` writes its running statistics, but its
    schema marks nothing written: no table calls it impure and only the guard refuses it."""

    def __init__(self, stats: bool, training: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))
        self.rm = nn.Parameter(torch.zeros(3), requires_grad=False)
        self.rv = nn.Parameter(torch.ones(3), requires_grad=False)
        self.stats = stats
        self.training_flag = training

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rm, rv = (self.rm, self.rv) if self.stats else (None, None)
        normed = torch.native_batch_norm(self.w, None, None, rm, rv, self.training_flag, 0.1, 1e-5)
        return x + normed[0] + self.rm * 2


def test_guard_refuses_native_batch_norm_updating_constant_stats() -> None:
    model = NativeBatchNorm(stats=True, training=True).eval()
    gm, result = _fold(model)
    assert result.rewrites == 0
    assert result.skips[MUTATES] == 1
    # rm is written by the call: rm * 2 and everything computed from w stay in the graph
    assert result.skips["constant is mutated in place by the graph"] == 1
    assert count_calls(gm, torch.native_batch_norm) == 1 and count_calls(gm, operator.mul) == 1
    assert torch.equal(gm.get_parameter("rm"), torch.zeros(3))  # refused before it ran
    assert torch.equal(gm.get_parameter("rv"), torch.ones(3))
    reference = copy.deepcopy(model)
    x = torch.randn(4, 3)
    for _ in range(3):  # each call moves the running mean: a buffer would freeze it
        with torch.no_grad():
            assert torch.equal(gm(x), reference(x))


@pytest.mark.parametrize(
    ("stats", "training"),
    [(False, True), (True, False)],  # batch statistics only; running stats read, not written
)
def test_native_batch_norm_that_writes_no_constant_is_folded(stats: bool, training: bool) -> None:
    model = NativeBatchNorm(stats, training).eval()
    gm, result = _fold(model)
    assert result.skips == {}
    assert result.rewrites == 2  # native_batch_norm(...)[0] and rm * 2
    assert count_calls(gm, torch.native_batch_norm) == 0 and count_calls(gm, operator.mul) == 0
    x = torch.randn(4, 3)
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))


def test_guard_refuses_batch_norm_writing_either_protected_statistic() -> None:
    """Direct unit test of the guard: the pass protects every constant, so there both running
    statistics are always protected together; the guard's contract is per storage, and a
    protected running mean next to a fresh running variance must be refused too."""
    w = torch.randn(4, 3)
    for protected in ("mean", "var"):
        mean, var = torch.zeros(3), torch.ones(3)
        keys = storages(mean if protected == "mean" else var)
        with pytest.raises(NotConstantError, match=MUTATES), ConstantGuard(keys):
            torch.native_batch_norm(w, None, None, mean, var, True, 0.1, 1e-5)
        assert torch.equal(mean, torch.zeros(3)) and torch.equal(var, torch.ones(3))


class EmbeddingMaxNorm(nn.Module):
    """nn.Embedding with ``max_norm`` renormalizes the rows it looks up *in its weight*, in
    place (``embedding_renorm_``), behind a call every table calls pure."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3, max_norm=1.0)
        with torch.no_grad():
            self.emb.weight.mul_(4)  # rows well over the max norm
        self.idx = nn.Parameter(torch.tensor([0, 2]), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.emb(self.idx) + self.emb.weight[1] * 2


def test_guard_refuses_a_write_declared_in_the_schema_of_an_inner_op() -> None:
    model = EmbeddingMaxNorm().eval()
    weight = model.emb.weight.detach().clone()
    gm, result = _fold(model)
    assert result.rewrites == 0
    assert result.skips == {MUTATES: 1, "constant is mutated in place by the graph": 2}
    assert torch.equal(gm.get_parameter("emb.weight"), weight)  # refused before it ran
    assert count_modules(gm, nn.Embedding) == 1 and count_calls(gm, operator.mul) == 1
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3)
    for _ in range(2):  # the first call renormalizes rows 0 and 2 of the weight
        with torch.no_grad():
            assert torch.equal(gm(x), reference(x))


class BatchNormIntoBuffers(nn.Module):
    """``out=`` given as a tuple of constants: ``native_batch_norm`` writes all three."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))
        self.normed = nn.Parameter(torch.zeros(4, 3), requires_grad=False)
        self.mean = nn.Parameter(torch.zeros(3), requires_grad=False)
        self.invstd = nn.Parameter(torch.zeros(3), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = (self.normed, self.mean, self.invstd)
        torch.native_batch_norm(self.w, None, None, None, None, True, 0.1, 1e-5, out=out)
        return x + self.normed * 2


def test_out_given_as_a_tuple_is_a_write() -> None:
    """fxmobile.ops saw ``out=`` only as one node, so the op was called pure and only the
    guard stopped it from running on the constants (found by mutation testing)."""
    model = BatchNormIntoBuffers().eval()
    gm, result = _fold(model)
    assert result.rewrites == 0
    assert result.skips == {INPLACE: 1, "constant is mutated in place by the graph": 1}
    assert torch.equal(gm.get_parameter("normed"), torch.zeros(4, 3))  # refused before it ran
    assert count_calls(gm, torch.native_batch_norm) == 1 and count_calls(gm, operator.mul) == 1
    x = torch.randn(4, 3)
    with torch.no_grad():
        assert torch.equal(gm(x), copy.deepcopy(model)(x))


class OneHotOfConstant(nn.Module):
    """F.one_hot scatters into a tensor it has just made: a write, but to no constant."""

    def __init__(self) -> None:
        super().__init__()
        self.idx = nn.Parameter(torch.tensor([0, 3, 1]), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * F.one_hot(self.idx, 4)


def test_guard_allows_writes_to_fresh_tensors() -> None:
    model = OneHotOfConstant().eval()
    gm, result = _fold(model)
    assert result.skips == {}
    assert result.rewrites == 1 and count_calls(gm, F.one_hot) == 0
    x = torch.randn(3, 4)
    assert torch.equal(gm(x), model(x))


# --- what the evaluation passes on, and what it refuses -------------------------------------


def _graph_on(root: nn.Module, build: object) -> fx.GraphModule:
    """A hand-built graph over ``root``'s attributes, for calls symbolic tracing would spell
    differently (it moves every argument after the tensors into keywords)."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x))  # type: ignore[operator]
    return fx.GraphModule(root, graph)


def test_keyword_arguments_reach_the_evaluated_call() -> None:
    root = nn.Module()
    root.w = nn.Parameter(torch.randn(4, 3))

    def build(g: fx.Graph, x: fx.Node) -> fx.Node:
        ones = g.call_function(torch.ones, (3,), {"dtype": torch.float64})
        total = g.call_method("sum", (g.get_attr("w"),), {"dim": 0})
        return g.call_function(operator.add, (g.call_function(operator.mul, (x, ones)), total))

    gm = _graph_on(root, build)
    result = FoldConstants().call(gm, FxContext())
    gm.recompile()
    assert result.rewrites == 2 and result.skips == {}
    assert [(b.dtype, b.shape) for b in gm.buffers()] == [
        (torch.float64, (3,)),
        (torch.float32, (3,)),
    ]
    x = torch.randn(3, dtype=torch.float64)
    assert torch.equal(gm(x), x * torch.ones(3, dtype=torch.float64) + root.w.sum(dim=0))


class ModulesOfConstant(nn.Module):
    """A learned sequence through eval-mode torch.nn modules: a constant, computed once."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Parameter(torch.randn(5, 2, 4))
        self.lstm = nn.LSTM(4, 4)
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(input=self.lstm(self.seq)[0])  # by keyword: reaches the module


def test_eval_modules_on_constants_are_folded() -> None:
    torch.manual_seed(0)
    model = ModulesOfConstant().eval()
    gm, result = _fold(model)
    assert result.rewrites == 1 and result.skips == {}
    assert count_modules(gm, nn.LSTM) == 0 and count_modules(gm, nn.Linear) == 0
    assert [tuple(b.shape) for b in gm.buffers()] == [(5, 2, 4)]
    x = torch.randn(5, 2, 4)
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))


@torch.fx.wrap
def user_scale(t: torch.Tensor) -> torch.Tensor:
    return t * 2


class UserFunctionOfConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + user_scale(self.w)


def test_user_function_of_constants_is_not_evaluated() -> None:
    """A wrapped user function may have side effects fxmobile cannot see: never run it."""
    model = UserFunctionOfConstant().eval()
    gm, result = _fold(model)
    assert result.rewrites == 0
    assert result.skips == {"function outside torch not known to be pure": 1}
    assert count_calls(gm, user_scale) == 1
    x = torch.randn(4)
    assert torch.equal(gm(x), model(x))


class TrainingBatchNormOfConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bn(self.w)


def test_module_in_training_mode_is_not_evaluated() -> None:
    model = TrainingBatchNormOfConstant().train()
    gm, result = _fold(model)
    assert result.rewrites == 0
    assert result.skips == {"module in training mode (may be random or update its state)": 1}
    assert torch.equal(gm.get_buffer("bn.running_mean"), torch.zeros(3))  # never ran
    assert count_modules(gm, nn.BatchNorm1d) == 1
    reference = copy.deepcopy(model)
    x = torch.randn(4, 3)
    for _ in range(2):
        assert torch.equal(gm(x), reference(x))


class EvalBatchNormOfConstant(nn.Module):
    """F.batch_norm in eval mode reads its running statistics and writes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))
        self.rm = nn.Parameter(torch.randn(3), requires_grad=False)
        self.rv = nn.Parameter(torch.rand(3) + 0.5, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.batch_norm(self.w, self.rm, self.rv, training=False)


def test_eval_batch_norm_of_constants_is_folded() -> None:
    model = EvalBatchNormOfConstant().eval()
    gm, result = _fold(model)
    assert result.rewrites == 1 and result.skips == {}
    assert count_calls(gm, F.batch_norm) == 0
    x = torch.randn(4, 3)
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))


def _flag_graph(call: str) -> fx.GraphModule:
    root = nn.Module()
    root.w = nn.Parameter(torch.randn(4, 3))
    root.rm = nn.Parameter(torch.randn(3), requires_grad=False)
    root.rv = nn.Parameter(torch.rand(3) + 0.5, requires_grad=False)

    def build(g: fx.Graph, x: fx.Node) -> fx.Node:
        w, rm, rv = g.get_attr("w"), g.get_attr("rm"), g.get_attr("rv")
        calls: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
            "batch_norm": (F.batch_norm, (w, rm, rv)),  # training defaults to False
            "batch_norm_5_args": (F.batch_norm, (w, rm, rv, None, None)),
            "batch_norm_training": (F.batch_norm, (w, rm, rv, None, None, True)),
            "dropout_positional": (F.dropout, (w, 0.5, False)),
            "dropout": (F.dropout, (w, 0.5)),  # training defaults to True
            "alpha_dropout": (F.alpha_dropout, (w, 0.5)),  # training defaults to False
        }
        target, args = calls[call]
        return g.call_function(operator.add, (x, g.call_function(target, args)))

    return _graph_on(root, build)


@pytest.mark.parametrize(
    ("call", "skips"),
    [
        ("batch_norm", {}),
        ("batch_norm_5_args", {}),
        ("batch_norm_training", {STATS: 1}),
        ("dropout_positional", {}),
        ("dropout", {RANDOM: 1}),
        ("alpha_dropout", {}),
    ],
)
def test_training_flag_read_by_position_keyword_or_default(
    call: str, skips: dict[str, int]
) -> None:
    """The ``training`` flag of F.batch_norm and the dropouts decides whether the call is a
    constant; hand-built graphs spell it positionally or leave it to its default."""
    gm = _flag_graph(call)
    reference = copy.deepcopy(gm)
    result = FoldConstants().call(gm, FxContext())
    gm.recompile()
    assert result.skips == skips
    assert result.rewrites == (0 if skips else 1)
    x = torch.randn(4, 3)
    if call != "dropout":
        with torch.no_grad():
            assert torch.equal(gm(x), reference(x))


class Grows(nn.Module):
    def __init__(self, shape: tuple[int, int], summed: bool, rows: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(*shape))
        self.s = nn.Parameter(torch.randn(1, shape[1]))
        self.summed = summed
        self.rows, self.cols = rows, shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w: torch.Tensor = self.w
        if self.summed:  # w reached last, after a node (s * 2) met twice on the way
            s = self.s * 2
            w = (self.w.sum(0, keepdim=True) * (s + 1)) * (s - 1)
        return x + w.expand(self.rows, self.cols)


KIB = 1 << 10


@pytest.mark.parametrize(
    ("shape", "summed", "rows", "folded"),
    [
        ((1, 128 * KIB), False, 4, True),  # 2 MiB from 512 KiB: 4x exactly, not more
        ((1, 128 * KIB), False, 5, False),  # 2.5 MiB: more than 4x, over 1 MiB
        ((1, 32 * KIB), False, 8, True),  # 8x, but 1 MiB exactly, not more
        ((1, 32 * KIB), False, 9, False),
        # measured against the parameters the result is computed from (w: 1 MiB, s: 4 KiB),
        # not against the small intermediates that it expands
        ((256, KIB), True, KIB + 4, True),
        ((256, KIB), True, KIB + 5, False),
    ],
)
def test_growth_limit_is_four_times_the_source_and_one_mib(
    shape: tuple[int, int], summed: bool, rows: int, folded: bool
) -> None:
    model = Grows(shape, summed, rows).eval()
    gm, result = _fold(model)
    assert ("folded result would grow the model" in result.skips) is not folded
    assert count_calls(gm, "expand") == (0 if folded else 1)
    x = torch.randn(rows, shape[1])
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))


class IndexedByConstants(nn.Module):
    """Advanced indexing with a constant tuple of index tensors (a relative-position table):
    the tuple is the folded value, passed whole to its non-constant user, by position to one
    and by keyword to the other."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.tensor([[0, 2, 1], [1, 0, 2]]), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = self.pos.unbind(0)
        return x[index] + x.index_put(indices=index, values=x[0, 0] * 2).sum()


def test_tuple_of_constants_becomes_a_tuple_of_buffers_in_each_user() -> None:
    torch.manual_seed(0)
    model = IndexedByConstants().eval()
    gm, result = _fold(model)
    assert result.rewrites == 1 and result.skips == {}
    assert count_calls(gm, "unbind") == 0
    reads = tuple(n for n in gm.graph.nodes if n.op == "get_attr")
    assert [str(n.target) for n in reads] == ["_folded_0", "_folded_1"]
    assert any(n.target is operator.getitem and n.args[1] == reads for n in gm.graph.nodes)
    (put,) = (n for n in gm.graph.nodes if n.target == "index_put")
    assert put.kwargs["indices"] == reads
    for node in reads:  # each row copied out of pos, which is gone
        row = gm.get_buffer(str(node.target))
        assert row.untyped_storage().nbytes() == 3 * row.element_size()
    assert not any(True for _ in gm.parameters())
    x = torch.randn(3, 3)
    assert torch.equal(gm(x), model(x))


class SecondAttributeItself(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(4))
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a + self.b.float()


def test_result_that_is_any_existing_attribute_reads_it() -> None:
    """``b.float()`` is ``b`` itself, and ``b`` is not the first attribute searched."""
    model = SecondAttributeItself().eval()
    gm, result = _fold(model)
    assert result.rewrites == 1
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["a", "b"]
    assert not any(True for _ in gm.buffers())
    x = torch.randn(4)
    assert torch.equal(gm(x), model(x))


class ExpandedIntermediate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(1, 1024))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.w * 2).expand(4, 1024)


def test_broadcast_of_a_computed_constant_is_stored_at_its_source_size() -> None:
    """An expand views a *smaller* storage (w * 2, which nothing else keeps): stored as is, the
    buffer holds 1024 floats, not the 4096 a copy would."""
    model = ExpandedIntermediate().eval()
    gm, result = _fold(model)
    assert result.rewrites == 1 and count_calls(gm, "expand") == 0
    (name,) = _folded_buffers(gm)
    buffer = gm.get_buffer(name)
    assert buffer.shape == (4, 1024) and buffer.stride() == (0, 1)
    assert buffer.untyped_storage().nbytes() == 1024 * 4
    x = torch.randn(4, 1024)
    assert torch.equal(gm(x), model(x))


class SparseOfConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4) * (torch.rand(3, 4) > 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(self.w.to_sparse(), x)


def test_sparse_constant_without_plain_storage_becomes_a_buffer() -> None:
    torch.manual_seed(0)
    model = SparseOfConstant().eval()
    gm, result = _fold(model)
    assert result.rewrites == 1 and count_calls(gm, "to_sparse") == 0
    (name,) = _folded_buffers(gm)
    assert gm.get_buffer(name).is_sparse
    x = torch.randn(4, 2)
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))


class ThreeOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(4))
        self.b = nn.Parameter(torch.randn(4))
        self.c = nn.Parameter(torch.randn(4))
        self._folded_1 = nn.Parameter(torch.randn(4))  # a name a folded module could hold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.a * 2) + self.b.sum() * x + (self.c + 1) + self._folded_1


def test_buffers_take_the_first_free_folded_names_in_graph_order() -> None:
    model = ThreeOutputs().eval()
    gm, result = _fold(model)
    assert result.rewrites == 3
    reads = [str(n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    assert reads == ["_folded_0", "_folded_2", "_folded_3", "_folded_1"]
    x = torch.randn(4)
    assert torch.equal(gm(x), model(x))


class StridesRead(nn.Module):
    """``(w * 2)[::2].expand(2, 2)`` reads every other element of its source, twice: as many
    bytes as its source holds, yet no dense tensor. Its strides are read at run time."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (self.w * 2)[::2].expand(2, 2)
        return x.as_strided((2, 2), y.stride()) + y


def test_computed_view_stored_as_is_keeps_its_strides() -> None:
    model = StridesRead().eval()
    gm, result = _fold(model)
    assert result.rewrites == 1 and count_calls(gm, "expand") == 0
    (name,) = _folded_buffers(gm)
    assert gm.get_buffer(name).stride() == (0, 2)  # as the graph computed it
    x = torch.randn(8)
    assert torch.equal(gm(x), model(x))


class StridesOfParameterSlice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.w[:, ::2]  # strides (4, 2): a view no dense copy can keep
        return x.as_strided((2, 2), y.stride()) + y


def test_strides_read_at_run_time_of_a_folded_view_are_eager_strides() -> None:
    """A view of a parameter was copied into its own buffer; ``preserve_format`` keeps the
    strides only of a dense view, so a later ``y.stride()`` read (2, 1) where eager reads
    (4, 2) and ``as_strided`` picked other elements (found by mutation testing): a view no
    dense copy keeps the strides of is stored as it is."""
    model = StridesOfParameterSlice().eval()
    gm, _ = _fold(model)
    x = torch.arange(8.0)
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))


class InplaceRandomOfConstant(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6))
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.w * 2
        if self.kind == "bernoulli_":  # a method: overwrites every element, reads none
            y.bernoulli_(0.5)
        elif self.kind == "dropout_inplace":  # reads y and scales it in place
            F.dropout(y, 0.5, training=True, inplace=True)
        else:  # leaky relu in place with a random slope: reads y and writes it back
            F.rrelu_(y)
        return x + y


def _same_draws(model: nn.Module, gm: fx.GraphModule, x: torch.Tensor, calls: int) -> None:
    for _ in range(calls):
        torch.manual_seed(0)
        expected = model(x)
        torch.manual_seed(0)
        with torch.no_grad():
            assert torch.equal(gm(x), expected)


def test_inplace_random_method_on_a_constant_is_not_evaluated() -> None:
    model = InplaceRandomOfConstant("bernoulli_").eval()
    state = torch.get_rng_state()
    gm, result = _fold(model)
    assert torch.equal(torch.get_rng_state(), state)
    assert RANDOM in result.skips
    assert count_calls(gm, "bernoulli_") == 1
    _same_draws(model, gm, torch.zeros(6), calls=3)


def test_inplace_random_op_that_reads_a_constant_keeps_it_computed() -> None:
    """``F.rrelu_(y)`` reads ``y = w * 2`` and writes it back. _may_write called a random op
    writing only with ``inplace=True`` in its kwargs, so ``w * 2`` became a buffer that each
    call scaled again (values shrinking call after call; found by mutation testing)."""
    model = InplaceRandomOfConstant("rrelu_").eval()
    gm, result = _fold(model)
    assert RANDOM in result.skips
    _same_draws(model, gm, torch.zeros(6), calls=3)


class EmbeddingOfTable(nn.Module):
    """F.embedding(max_norm=...) renormalizes rows of its table in place; which tables the
    guard protects: a parameter read after other constants were computed, a plain tensor
    attribute set on the GraphModule (neither a parameter nor a buffer), a computed constant."""

    def __init__(self, table: str) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))
        self.idx = nn.Parameter(torch.tensor([0, 2]), requires_grad=False)
        self.param = nn.Parameter(torch.randn(5, 3) * 4)
        self.plain = torch.randn(5, 3) * 4
        self.table = table

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        table: torch.Tensor = self.plain if self.table == "plain" else self.param
        if self.table == "computed":
            table = table * 1
        scaled = self.w * 2  # computed after the table is read, before it is used
        return x + scaled + F.embedding(self.idx, table, max_norm=1.0)


@pytest.mark.parametrize("table", ["parameter", "plain", "computed"])
def test_guard_protects_every_constant_a_write_could_reach(table: str) -> None:
    model = EmbeddingOfTable(table).eval()
    gm = fx.symbolic_trace(copy.deepcopy(model))
    if table == "plain":  # the GraphModule made it a buffer; an attribute set later is not one
        value = gm.plain
        del gm.plain
        gm.plain = value
        assert "plain" not in dict(gm.named_buffers())
    result = FoldConstants().call(gm, FxContext())
    gm.recompile()
    assert result.skips[MUTATES] == 1
    assert count_calls(gm, F.embedding) == 1
    source = {"parameter": "param", "plain": "plain"}.get(table)
    if source is not None:  # refused before it ran
        assert torch.equal(getattr(gm, source), getattr(model, source))
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3)
    for _ in range(2):
        with torch.no_grad():
            assert torch.equal(gm(x), reference(x))


def test_inplace_dropout_keeps_the_constant_it_writes_computed() -> None:
    """``F.dropout(y, inplace=True)`` draws *and* writes y: ``w * 2`` folded into a buffer
    would be zeroed and rescaled again on every call."""
    model = InplaceRandomOfConstant("dropout_inplace").eval()
    gm, result = _fold(model)
    assert result.rewrites == 0
    assert result.skips == {RANDOM: 1, "constant is mutated in place by the graph": 1}
    assert count_calls(gm, operator.mul) == 1
    _same_draws(model, gm, torch.zeros(6), calls=3)


def test_guard_refuses_writes_to_constants_passed_by_keyword() -> None:
    """The guard reads a written argument from the keywords when it is not positional."""
    protected = torch.zeros(3)
    with pytest.raises(NotConstantError, match=MUTATES), ConstantGuard(storages(protected)):
        torch.add(torch.ones(3), torch.ones(3), out=protected)
    assert torch.equal(protected, torch.zeros(3))


class ReturnsOnlyConstants(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.w * 2, self.w.sum()


def test_constants_returned_as_they_are_say_so_and_nothing_else() -> None:
    """Each returned constant stays computed (a buffer returned would be the caller's to write);
    the output itself is not a node to evaluate."""
    model = ReturnsOnlyConstants().eval()
    gm, result = _fold(model)
    assert (result.rewrites, result.skips) == (0, {"constant returned as a model output": 2})
    x = torch.randn(2)
    with torch.no_grad():
        for got, expected in zip(gm(x), model(x), strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


class ViewsToTheWrongSize(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w.view(7)


def test_a_constant_whose_evaluation_raises_is_left_to_raise_at_run_time() -> None:
    """``optimize_fx`` without example inputs never runs eager: the fold is the first to call
    ``view(7)`` on six elements. The op stays, named in the report, and raises as eager does."""
    gm, result = _fold(ViewsToTheWrongSize().eval())
    assert (result.rewrites, result.skips) == (0, {"could not evaluate constant (RuntimeError)": 1})
    with pytest.raises(RuntimeError, match="invalid for input of size 6"):
        gm(torch.randn(7))
