"""fuse_add_relu (XNNPACK): an integer add followed by ReLU as one ``aten::_add_relu`` kernel.

    relu(add(a, b)) / relu_(add(a, b)) -> _add_relu(a, b);  relu_(add_(a, b)) -> _add_relu_(a, b)

Counts of ``aten::_add_relu`` / ``_add_relu_`` (there) and of the relus (gone), exact equality on
integers, and the methods left whole, with their reasons: a float add (``_add_relu`` turns NaN
into 0 and inf into the dtype's maximum), an add that reads memory another op writes in place
(through a view too), an ``add_`` whose target another op reads, an add whose first operand is
a constant or of another dtype than the add's result, and an add whose operand dtypes are
unknown (a scripted graph without example inputs, an add the probe run cannot see).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxmobile
from fxmobile.backends.xnnpack import fuse_add_relu
from fxmobile.backends.xnnpack.fuse_add_relu import (
    ALIASED,
    FLOATING,
    MIXED_DTYPES,
    READ_ELSEWHERE,
    UNKNOWN_DTYPES,
    FuseAddRelu,
    static_dtypes,
)
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.script.common import CTX, frozen, kinds, with_inputs

RELUS = {"aten::relu", "aten::relu_"}
# Integers of both signs, and int32's maximum: relu(a + b) wraps before it clamps, as add does.
A = torch.tensor([-7, 0, 3, 2**31 - 1], dtype=torch.int32)
B = torch.tensor([2, -1, 4, 1], dtype=torch.int32)


class AddRelu(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.relu(a + b)
        z = a.add(b, alpha=2).relu_()
        return y + z


def test_integer_add_then_relu_is_fused() -> None:
    model = AddRelu()
    result = FuseAddRelu().call(frozen(model), with_inputs(A, B))
    assert result.rewrites == 2 and result.skips == {}
    after = kinds(result.unit)
    assert after["aten::_add_relu"] == 2 and not RELUS & set(after)
    assert torch.equal(result.unit(A, B), model(A, B))


NONFINITE = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5, -2.0])


def test_a_float_add_is_left_alone_because_relu_keeps_nan_and_infinity() -> None:
    """F12, found by the fuzzer's NaN probe: fused, NaN came back 0 and inf 3.4e38."""
    fused = torch.ops.aten._add_relu(NONFINITE, torch.zeros(5))
    assert fused[0] == 0 and fused[1] == torch.finfo(torch.float32).max  # the reason holds
    model = AddRelu()
    for dtype in (torch.float32, torch.float64):
        a, b = NONFINITE.to(dtype), torch.zeros(5, dtype=dtype)
        result = FuseAddRelu().call(frozen(model), with_inputs(a, b))
        assert result.rewrites == 0 and result.skips == {FLOATING: 1}
        assert kinds(result.unit)["aten::_add_relu"] == 0
        torch.testing.assert_close(result.unit(a, b), model(a, b), equal_nan=True)


def test_a_graph_that_says_its_dtypes_fuses_without_example_inputs() -> None:
    model = AddRelu()
    traced = torch.jit.trace(model.eval(), (A, B))  # not frozen: freezing erases the types
    result = FuseAddRelu().call(traced, CTX)
    assert result.rewrites == 2 and result.skips == {}
    assert torch.equal(result.unit(A, B), model(A, B))
    traced = torch.jit.trace(model.eval(), (A.float(), B.float()))  # float: the types say so
    assert FuseAddRelu().call(traced, CTX).skips == {FLOATING: 1}


def test_a_scripted_graph_without_example_inputs_is_left_alone() -> None:
    model = AddRelu()
    result = FuseAddRelu().call(frozen(model), CTX)
    assert result.rewrites == 0 and result.skips == {UNKNOWN_DTYPES: 1}
    assert kinds(result.unit)["aten::_add_relu"] == 0


class ResidualInPlace(nn.Module):
    """resnet's ``out += identity; relu_(out)``: the add_ writes a tensor nothing else reads."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x * 3
        out += x
        return torch.relu_(out)


def test_resnets_in_place_residual_is_fused_in_place() -> None:
    model = ResidualInPlace().eval()
    result = FuseAddRelu().call(frozen(model), with_inputs(A))
    assert result.rewrites == 1 and result.skips == {}
    after = kinds(result.unit)
    assert after["aten::_add_relu_"] == 1 and not RELUS & set(after)
    assert torch.equal(result.unit(A), model(A))


class WrittenThroughView(nn.Module):
    """Found by the fuzzer: torch placed ``_add_relu(x, x)`` before the write through the view."""

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        x = a * 2
        x.unsqueeze(-1).add_(1.5)
        return torch.relu(x + x)


class ReadBeforeInPlaceAdd(nn.Module):
    """Found by the fuzzer: ``_add_relu_(x, c)`` moved above a ``relu(x)`` that read ``x``."""

    def forward(self, a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        x = a * 2
        first = torch.relu(x)
        x.add_(c)
        return torch.relu_(x) + first


class ConstantFirst(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.tensor(0.5, dtype=torch.float64) + a)


class IntegerConstantFirst(nn.Module):
    """Of the add's own dtype: only the constant check says no."""

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.tensor([1, -2, 3, -4], dtype=torch.int32) + a)


LEFT_ALONE = {
    "written through a view": (WrittenThroughView(), ALIASED, (torch.randn(4),)),
    "add_ target read elsewhere": (
        ReadBeforeInPlaceAdd(), READ_ELSEWHERE, (torch.randn(4), torch.randn(4))
    ),
    "constant first operand": (ConstantFirst(), MIXED_DTYPES, (torch.randn(4),)),
    "integer constant first operand": (IntegerConstantFirst(), MIXED_DTYPES, (A,)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(LEFT_ALONE))
def test_a_method_where_fusing_could_change_a_result_is_left_alone(name: str) -> None:
    model, reason, inputs = LEFT_ALONE[name]
    module = frozen(model)
    before = kinds(module)
    result = FuseAddRelu().call(module, with_inputs(*inputs))
    assert result.rewrites == 0 and result.skips == {reason: 1}
    after = kinds(result.unit)
    assert after["aten::_add_relu"] == after["aten::_add_relu_"] == 0
    assert sum(after[k] for k in RELUS) == sum(before[k] for k in RELUS)
    with torch.no_grad():
        torch.testing.assert_close(result.unit(*inputs), model(*inputs))


class Add(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a + b)


def test_operands_the_graph_knows_to_differ_in_dtype_are_left_alone() -> None:
    module = frozen(Add())
    a, b = list(module.graph.inputs())[1:]
    a.setType(a.type().with_dtype(torch.int64))
    b.setType(b.type().with_dtype(torch.int32))
    result = FuseAddRelu().call(module, CTX)
    assert result.rewrites == 0 and result.skips == {MIXED_DTYPES: 1}
    b.setType(b.type().with_dtype(torch.int64))  # the same dtype: fused
    result = FuseAddRelu().call(module, CTX)
    assert result.rewrites == 1 and result.skips == {}


class BoolFirst(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu((a > 0) + b)


class Float64ScalarFirst(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a.double().sum() + b)


MAY_DIFFER = [BoolFirst(), Float64ScalarFirst()]


@pytest.mark.parametrize("model", MAY_DIFFER, ids=["bool", "float64"])
def test_an_add_whose_first_operand_may_be_of_another_dtype_is_left_alone(
    model: nn.Module,
) -> None:
    """Fused, these failed at run time: "value cannot be converted to type float without
    overflow" (float64 0-dim first), an INTERNAL ASSERT in BinaryOps.cpp (bool first)."""
    a, b = torch.randn(4), torch.randn(4)
    result = FuseAddRelu().call(frozen(model), CTX)  # no types, no example: unknown
    assert result.rewrites == 0 and result.skips == {UNKNOWN_DTYPES: 1}
    torch.testing.assert_close(result.unit(a, b), model(a, b))
    result = FuseAddRelu().call(frozen(model), with_inputs(a, b))  # the run shows them differ
    assert result.rewrites == 0 and result.skips == {MIXED_DTYPES: 1}
    torch.testing.assert_close(result.unit(a, b), model(a, b))


@pytest.mark.parametrize("model", MAY_DIFFER, ids=["bool", "float64"])
def test_optimize_for_mobile_returns_a_module_that_runs(model: nn.Module) -> None:
    a, b = torch.randn(4), torch.randn(4)
    for given in (model.eval(), torch.jit.script(model.eval())):
        optimized = fxmobile.optimize_for_mobile(given)
        torch.testing.assert_close(optimized(a, b), model(a, b))


class Int64First(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a.long() + b.int().sum())  # int64 [4] + int32 0-dim: int64


class IntegerFirst(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return torch.relu(a.long() + 0.5)  # int64 + a float number: float32


def test_the_run_decides_by_the_result_dtype_not_by_equal_dtypes() -> None:
    model = Int64First()
    a, b = torch.randn(4) * 5, torch.randn(4) * 5
    result = FuseAddRelu().call(frozen(model), with_inputs(a, b))
    assert result.rewrites == 1 and result.skips == {}
    assert result.unit(a, b).dtype == torch.int64
    assert torch.equal(result.unit(a, b), model(a, b))
    x = torch.randn(4) * 3
    result = FuseAddRelu().call(frozen(IntegerFirst()), with_inputs(x))
    assert result.rewrites == 0 and result.skips == {MIXED_DTYPES: 1}
    torch.testing.assert_close(result.unit(x), IntegerFirst()(x))


def test_an_integer_dtype_without_bounds_in_add_relu_is_left_alone() -> None:
    """``_add_relu`` has no bounds for uint8: fused, it failed an INTERNAL ASSERT."""
    a, b = A.abs().to(torch.uint8), B.abs().to(torch.uint8)
    result = FuseAddRelu().call(frozen(Add()), with_inputs(a, b))
    assert result.rewrites == 0 and result.skips == {MIXED_DTYPES: 1}
    assert torch.equal(result.unit(a, b), Add()(a, b))


class AddInABranch(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if bool(a.sum() > 0):
            c = a.to(b.dtype)  # made in the branch, by an op that may change the dtype
            return torch.relu(c + b)
        return b


def test_an_add_the_run_cannot_see_is_left_alone() -> None:
    model = AddInABranch()
    a, b = torch.ones(4), torch.randn(4)
    result = FuseAddRelu().call(frozen(model), with_inputs(a, b))
    assert result.rewrites == 0 and result.skips == {UNKNOWN_DTYPES: 1}
    torch.testing.assert_close(result.unit(a, b), model(a, b))


class ConvResidual(nn.Module):
    """resnet's block: the residual add reads two tensors made from the input by ops that keep
    its dtype (float: left alone); then an add in a branch, of the input and a conv output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        out = self.conv(y)
        out += y
        out = torch.relu_(out)
        if bool(x.sum() > 0):
            out = torch.relu(self.fc(out) + x)
        return out


def test_dtypes_that_follow_from_the_example_inputs_need_no_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = ConvResidual().eval()
    x = torch.randn(1, 3, 4, 4)
    runs = []
    monkeypatch.setattr(fuse_add_relu, "probe", lambda *args: runs.append(args))
    result = FuseAddRelu().call(frozen(model), with_inputs(x))
    assert (result.rewrites, result.skips, runs) == (0, {FLOATING: 1}, [])
    after = kinds(result.unit)
    assert (after["aten::_add_relu_"], after["aten::_add_relu"]) == (0, 0)
    assert_equivalent(model, result.unit, x)


class Reshaped(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.max_pool2d(F.hardtanh(x), 1).flatten(2).reshape(x.shape).contiguous()
        return y.view(torch.int32)  # reinterpreted: another dtype


def test_dtypes_follow_only_through_ops_that_keep_them() -> None:
    x = torch.randn(1, 2, 4, 4)
    graph = frozen(Reshaped()).graph
    known = static_dtypes(graph, (x,))
    ops = {n.kind(): n.output() for n in graph.nodes() if n.kind().startswith("aten::")}
    for kind in ("hardtanh", "max_pool2d", "flatten", "reshape", "contiguous"):
        assert known[ops[f"aten::{kind}"]] == torch.float32, kind
    assert ops["aten::view"] not in known
    module = frozen(IntegerFirst())
    x = torch.randn(4)
    graph = module.graph
    (add,) = [n for n in graph.nodes() if n.kind() == "aten::add"]
    known = static_dtypes(graph, (x,))
    assert known[list(graph.inputs())[1]] == torch.float32
    assert add.inputsAt(0) not in known and add.output() not in known  # a.long(): another dtype
    same = frozen(Add())
    (add,) = [n for n in same.graph.nodes() if n.kind() == "aten::add"]
    assert static_dtypes(same.graph, (x, x.double()))[add.inputsAt(1)] == torch.float64
    assert add.output() not in static_dtypes(same.graph, (x, x.double()))  # mixed: unknown
    assert static_dtypes(same.graph, (x, x))[add.output()] == torch.float32


class SizeArithmetic(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n = a.size(0) + 1  # an int add no relu reads: not a candidate
        return torch.relu(a + b)[:n]


def test_an_add_no_relu_reads_does_not_hold_the_method_back() -> None:
    model = SizeArithmetic()
    result = FuseAddRelu().call(frozen(model), with_inputs(A, B))
    assert result.rewrites == 1 and result.skips == {}
    assert torch.equal(result.unit(A, B), model(A, B))
    assert FuseAddRelu().call(frozen(model), CTX).skips == {UNKNOWN_DTYPES: 1}


def test_the_reason_names_the_first_check_that_fails_in_each_method() -> None:
    class Both(AddRelu):
        @torch.jit.export
        def aliased(self, a: torch.Tensor) -> torch.Tensor:
            x = a * 2
            x.unsqueeze(-1).add_(1)
            return torch.relu(x + x)

    model = Both()
    a, b = A, B
    ctx = ScriptContext(("forward", "aliased"), ("aliased",), (a, b))
    module = frozen(model, ("aliased",))
    result = FuseAddRelu().call(module, ctx)  # the example inputs are forward's alone
    assert result.rewrites == 2 and result.skips == {UNKNOWN_DTYPES: 1}
    module = frozen(model, ("aliased",))
    add = module._c._get_method("aliased").graph.findNode("aten::add")
    x = add.inputsAt(0)
    x.setType(x.type().with_dtype(torch.int32))  # the dtype known: the aliasing check speaks
    result = FuseAddRelu().call(module, ctx)
    assert result.rewrites == 2 and result.skips == {ALIASED: 1}
    assert kinds(result.unit, "aliased")["aten::_add_relu"] == 0
    assert torch.equal(result.unit.aliased(a), model.aliased(a))


def test_the_reasons_say_what_they_mean() -> None:
    assert FLOATING == (
        "method left alone: _add_relu would turn a float add's NaN into 0 and inf into its max"
    )
    assert ALIASED == "method left alone: an add reads memory that another op writes in place"
    assert READ_ELSEWHERE == "method left alone: an add_ writes a tensor that another op reads"
    assert MIXED_DTYPES == (
        "method left alone: an add's first operand is a constant or of another dtype"
    )
    assert UNKNOWN_DTYPES == (
        "method left alone: an add's operand dtypes are unknown (pass example_inputs)"
    )


@pytest.mark.parametrize("model", [nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.ReLU())])
def test_nothing_to_do_reports_zero(model: nn.Module) -> None:
    result = FuseAddRelu().call(frozen(model), CTX)
    assert result.rewrites == 0 and not result.modified and result.skips == {}
