"""use_inplace_ops: elementwise results written into a tensor nothing else reads; every case
where a write could be seen is left alone, with the reason."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile.report.records import PassRecord
from fxmobile.script import use_inplace_ops as inplace
from tests.helpers import assert_equivalent, randomize_batchnorm
from tests.script.common import kinds as inlined_kinds


def _record(result: fxmobile.MobileResult) -> PassRecord:
    return next(p for p in result.report.passes if p.name == "use_inplace_ops")


def _kinds(module: torch.jit.ScriptModule) -> list[str]:
    return [n.kind() for n in module.graph.nodes()]


class _SqueezeExcite(nn.Module):
    """mobilenet_v3's pattern: a residual add and a squeeze-excitation mul after convs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.hardswish(self.bn(self.conv(x)))
        s = nn.functional.hardsigmoid(self.fc(y.mean((2, 3), keepdim=True)))
        return self.fc(self.conv(s * y) + x)


def test_squeeze_excite_and_residual_run_in_place() -> None:
    model = randomize_batchnorm(_SqueezeExcite()).eval()
    x = torch.randn(2, 4, 6, 6)
    x0 = x.clone()
    for source in (model, torch.jit.script(model)):
        result = fxmobile.optimize(source, example_inputs=x)
        kinds = _kinds(result.module)
        assert "aten::mul_" in kinds and "aten::mul" not in kinds  # y.mul_(s): commuted
        assert "aten::hardsigmoid_" in kinds and "aten::hardsigmoid" not in kinds
        assert "aten::add_" in kinds and "aten::add" not in kinds  # into the conv's output
        assert_equivalent(model, result.module, x)
        assert torch.equal(x, x0)


class _Residual(nn.Module):
    """resnet's pattern: relu(conv(x) + x) before the next conv. The add is written into the
    conv's output (the second operand, x, is the caller's), then the relu into the add's."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        out += x
        return self.conv(torch.relu(out))


def test_an_add_a_conv_reads_through_a_relu_runs_in_place() -> None:
    """Without add + relu fusion (a float _add_relu loses NaN), the conv reads the relu: the add
    still writes into the first conv's buffer, so the second conv copies nothing (found by
    timing resnet18 on torch 2.12.1 with the add left out of place)."""
    model = _Residual().eval()
    x = torch.randn(1, 4, 5, 5)
    x0 = x.clone()
    result = fxmobile.optimize(model, example_inputs=x)
    kinds = _kinds(result.module)
    assert "aten::add_" in kinds and "aten::relu_" in kinds
    assert not {"aten::add", "aten::relu", "aten::_add_relu", "aten::_add_relu_"} & set(kinds)
    assert _record(result).rewrites == 2
    assert_equivalent(model, result.module, x)
    assert torch.equal(x, x0)
    nan = x.clone()
    nan[0, :, 1, 1] = float("nan")
    with torch.no_grad():
        torch.testing.assert_close(result.module(nan), model(nan), equal_nan=True)


def _count_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per run use_inplace_ops makes."""
    runs: list[int] = []
    real = inplace._probe

    def counted(*args: Any) -> Any:
        runs.append(1)
        return real(*args)

    monkeypatch.setattr(inplace, "_probe", counted)
    return runs


def test_shapes_that_follow_from_the_inputs_need_no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The add's operands are a conv's output and the input: static_shapes gives both."""
    runs = _count_runs(monkeypatch)
    model = _Residual().eval()
    x = torch.randn(1, 4, 5, 5)
    result = fxmobile.optimize(model, example_inputs=x)
    assert "aten::add_" in _kinds(result.module)
    assert runs == []


def test_a_shape_that_does_not_follow_is_taken_from_one_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """static_shapes has no rule for mean, so the squeeze-excitation mul's shapes come from a
    run, and the mul is still written in place."""
    runs = _count_runs(monkeypatch)
    model = randomize_batchnorm(_SqueezeExcite()).eval()
    x = torch.randn(2, 4, 6, 6)
    result = fxmobile.optimize(model, example_inputs=x)
    assert "aten::mul_" in _kinds(result.module)
    assert runs == [1]
    assert_equivalent(model, result.module, x)


def test_float64_keeps_float64_numerics() -> None:
    model = randomize_batchnorm(_SqueezeExcite()).eval().double()
    x = torch.randn(1, 4, 5, 5, dtype=torch.float64)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    assert _record(result).rewrites == 4  # hardswish, hardsigmoid, mul, add
    assert_equivalent(model, result.module, x, rel=1e-12)


class _ReadAfter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        z = torch.sigmoid(y)
        return z * y  # y is read after sigmoid: sigmoid_ would change it


class _Broadcasts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.conv(x).mean((2, 3), keepdim=True)
        return self.conv(pooled + x)  # pooled is fresh but broadcasts; x is the caller's


class _ViewKept(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        flat = y.flatten(1)  # a view of y, returned: y's write would show in it
        return torch.sigmoid(y), flat


class _Returned(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return y, torch.sigmoid(y)


class _ReturnsSum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + x  # no prepacked op reads the sum: nothing to save


class _IntegerSigmoid(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x.long() * 2)


def test_cases_that_must_be_left_alone() -> None:
    x = torch.randn(1, 3, 4, 4)
    for model, kind, reason in (
        (_ReadAfter(), "aten::sigmoid", inplace.READ_ELSEWHERE),
        (_ViewKept(), "aten::sigmoid", inplace.READ_ELSEWHERE),
        (_Returned(), "aten::sigmoid", inplace.READ_ELSEWHERE),
        (_ReturnsSum(), "aten::add", inplace.NO_PACKED_READER),
        (_Broadcasts(), "aten::add", inplace.BROADCASTS),
    ):
        model.eval()
        result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
        assert kind in _kinds(result.module), type(model).__name__
        assert reason in _record(result).skips, (type(model).__name__, _record(result).skips)
        assert_equivalent(model, result.module, x)


def test_binary_op_without_example_inputs_is_left_alone() -> None:
    model = _SqueezeExcite().eval()
    result = fxmobile.optimize(torch.jit.script(model))
    kinds = _kinds(result.module)
    assert "aten::mul" in kinds and "aten::add" in kinds
    assert "aten::hardsigmoid_" in kinds  # unary on a prepacked conv's output: always float
    assert inplace.SHAPE_UNKNOWN in _record(result).skips


def test_integer_tensor_is_not_written() -> None:
    model = _IntegerSigmoid().eval()
    x = torch.randn(1, 3, 4, 4) * 5
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    assert "aten::sigmoid" in _kinds(result.module)  # sigmoid_ cannot write a long tensor
    assert inplace.NOT_FLOATING in _record(result).skips
    assert torch.equal(result.module(x), model(x))


class _FreshSecond(nn.Module):
    """``op(x, conv(x))`` before a conv: the fresh tensor is the second operand."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.op == "add":
            z = x + y
        elif self.op == "add_alpha_2":
            z = torch.add(x, y, alpha=2)
        else:
            z = x - y
        return self.conv(z)


def test_an_add_is_written_into_its_fresh_second_operand() -> None:
    """x + conv(x) == conv(x) + x: with alpha 1 the operands swap, and the conv's output is
    written (x is the caller's)."""
    model = _FreshSecond("add").eval()
    x = torch.randn(1, 3, 4, 4)
    x0 = x.clone()
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    kinds = _kinds(result.module)
    assert "aten::add_" in kinds and "aten::add" not in kinds
    assert _record(result).rewrites == 1
    assert_equivalent(model, result.module, x)
    assert torch.equal(x, x0)


def test_operands_that_do_not_commute_are_not_swapped() -> None:
    """x + 2 * conv(x) is not conv(x) + 2 * x, nor is x - conv(x) conv(x) - x: with only the
    second operand fresh, neither is written."""
    x = torch.randn(1, 3, 4, 4)
    for op, kind in (("add_alpha_2", "aten::add"), ("sub", "aten::sub")):
        model = _FreshSecond(op).eval()
        result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
        assert kind in _kinds(result.module), op
        assert inplace.READ_ELSEWHERE in _record(result).skips, op
        assert _record(result).rewrites == 0, op
        assert_equivalent(model, result.module, x)


class _SigmoidOfProduct(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.sigmoid(x * 2))


def test_an_activation_of_a_fresh_floating_tensor_runs_in_place() -> None:
    """No prepacked op made ``x * 2``: the example inputs show it floating, so sigmoid writes
    it; without them its dtype is unknown and sigmoid is left alone."""
    model = _SigmoidOfProduct().eval()
    x = torch.randn(1, 3, 4, 4)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    kinds = _kinds(result.module)
    assert "aten::sigmoid_" in kinds and "aten::sigmoid" not in kinds
    assert _record(result).rewrites == 1
    assert_equivalent(model, result.module, x)
    unknown = fxmobile.optimize(torch.jit.script(model))
    assert "aten::sigmoid" in _kinds(unknown.module)
    assert inplace.NOT_FLOATING in _record(unknown).skips
    assert_equivalent(model, unknown.module, x)


class _ConstantMinus(nn.Module):
    """A frozen buffer with the result's shape, minus a conv's output: freezing makes the
    buffer a graph constant, the first operand."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.register_buffer("offset", torch.randn(1, 3, 4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.offset - self.conv(x))


def test_a_constant_is_never_written() -> None:
    """sub_(offset, y) would return the right numbers once and change every later call."""
    model = _ConstantMinus().eval()
    x = torch.randn(1, 3, 4, 4)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    assert "aten::sub" in _kinds(result.module)
    assert inplace.READ_ELSEWHERE in _record(result).skips
    for _ in range(2):
        assert_equivalent(model, result.module, x)


class _ActivationInLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        out = x
        for _ in range(x.size(0) + 1):
            out = out + torch.sigmoid(y)  # sigmoid_(y) would feed sigmoid(y) to the next turn
        return out


def test_a_tensor_made_before_a_loop_is_not_written_inside_it() -> None:
    """A write in the loop body would reach the next turn, which reads y again."""
    model = _ActivationInLoop().eval()
    x = torch.randn(1, 3, 4, 4)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    assert inlined_kinds(result.module)["prim::Loop"] == 1
    assert "aten::sigmoid" in inlined_kinds(result.module)
    # the pass visits the top-level block only: its one elementwise op is the integer add of
    # the trip count, no tensor to write
    assert _record(result).skips == {inplace.READ_ELSEWHERE: 1}
    assert_equivalent(model, result.module, x)


class _HalfPlusFloat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.half() * 2 + x)  # float16 + float32 -> float32


def test_an_operand_of_another_dtype_is_not_written() -> None:
    """The fresh operand has the result's shape but not its dtype: add_ would round the sum
    to float16 and hand the conv a float16 tensor."""
    model = _HalfPlusFloat().eval()
    x = torch.randn(1, 3, 4, 4)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    assert "aten::add" in _kinds(result.module)
    assert inplace.BROADCASTS in _record(result).skips
    assert_equivalent(model, result.module, x)


class _StridedView(nn.Module):
    """``prims::as_strided``'s schema marks its input written and its result the same tensor:
    an op torch's graph does not see through, outside ``aten``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        v = torch.ops.prims.as_strided(y, [1, 3, 4, 4], [48, 16, 4, 1], 0)
        return torch.sigmoid(v), y  # sigmoid_(v) would write y, returned


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_a_tensor_from_an_op_that_writes_is_not_written() -> None:
    """Only aten's in-place ops are followed back to the tensor they write; the result of any
    other op that writes is not made fresh, so it is never written."""
    model = _StridedView().eval()
    x = torch.randn(1, 3, 4, 4)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    assert "aten::sigmoid" in _kinds(result.module)
    assert _record(result).skips == {inplace.READ_ELSEWHERE: 1}
    assert_equivalent(model, result.module, x)


class _Methods(nn.Module):
    """A residual add before a conv in ``forward`` and in the preserved ``twice``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.conv(x) + x)

    @torch.jit.export
    def twice(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.conv(x) + x)


def test_a_binary_op_outside_forward_is_left_alone() -> None:
    """The example inputs are forward's: what a run of them says about another method's
    tensors (if it runs at all) does not hold for that method's own inputs."""
    model = _Methods().eval()
    x = torch.randn(1, 3, 4, 4)
    result = fxmobile.optimize(
        torch.jit.script(model), preserved_methods=["twice"], example_inputs=x
    )
    assert "aten::add_" in _kinds(result.module)  # forward's
    assert inlined_kinds(result.module, "twice")["aten::add"] == 1
    assert _record(result).skips == {inplace.SHAPE_UNKNOWN: 1}
    assert_equivalent(model.twice, result.module.twice, x)


class _OutVariant(nn.Module):
    """``torch.add(..., out=buf)`` scripts to ``aten::add`` with one input more, the ``out``
    overload's (``torch.sigmoid(..., out=buf)`` likewise); no in-place overload takes it."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        buf = torch.empty_like(x)
        if self.op == "add":
            z = torch.add(self.conv(x), x, out=buf)
        elif self.op == "add_commuted":
            z = torch.add(x, self.conv(x), out=buf)
        else:
            z = torch.sigmoid(self.conv(x), out=buf)
        return self.conv(z), buf


@pytest.mark.parametrize("op", ["add", "add_commuted", "sigmoid"])
def test_an_out_variant_is_left_alone(op: str) -> None:
    """Found by mutation testing (``_alpha_is_one``'s ``len(inputs) == 3``): the pass rewrote
    ``add(conv(x), x, 1, buf)`` into ``add_(conv(x), x, 1, buf)``, a node with no schema, and
    ``optimize`` failed with torch's "Schema not found for node. File a bug report."."""
    model = _OutVariant(op).eval()
    x = torch.randn(1, 3, 4, 4)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    assert f"aten::{op.removesuffix('_commuted')}_" not in _kinds(result.module)
    assert inplace.OUT_VARIANT in _record(result).skips
    assert_equivalent(model, result.module, x)


class _WrittenAliasReturned(nn.Module):
    """The fuzzer's model (script-cpu, seed 2064): ``t = relu_(y)`` is ``y`` under another
    name, returned; ``hardswish(y)`` after it must not write ``y``."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(x * 2)
        t = torch.relu_(y)
        return torch.relu(nn.functional.hardswish(y)), t


class _ListHeldAcrossTheWrite(nn.Module):
    """A list holding ``y``, made before ``sigmoid(y)`` and read after it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        held = [y, x]
        s = torch.sigmoid(y)
        return torch.cat(held) + s.sum()


@pytest.mark.parametrize("model", [_WrittenAliasReturned(), _ListHeldAcrossTheWrite()])
def test_regression_a_tensor_read_under_another_name_after_the_op_is_not_written(
    model: nn.Module,
) -> None:
    """Readers of the operand under another name (an in-place op's result, a list holding it)
    count as readers: hardswish_(y) had rewritten the returned ``t`` (off by 0.375)."""
    x = torch.tensor([[1.5, -0.5, 0.25]])
    result = fxmobile.optimize(torch.jit.script(model.eval()), example_inputs=x)
    assert inplace.READ_ELSEWHERE in _record(result).skips
    assert_equivalent(model, result.module, x)
