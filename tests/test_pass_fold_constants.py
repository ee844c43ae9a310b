"""FoldConstants: constant subgraphs become buffers; random, in-place and mutated ones stay."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from fxmobile.infra import PassResult
from fxmobile.passes.fold_constants import (
    INPLACE,
    RANDOM,
    STATS,
    UNINITIALIZED,
    FoldConstants,
)
from fxmobile.passes.stage import FxContext
from tests.helpers import assert_equivalent, count_calls, count_modules, run_fx_passes


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


class _LeafTracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, Opaque) or super().is_leaf_module(m, qualname)


def test_opaque_module_is_not_evaluated_and_its_state_not_folded() -> None:
    model = UsesOpaque().eval()
    copied = copy.deepcopy(model)
    gm = fx.GraphModule(copied, _LeafTracer().trace(copied))
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
