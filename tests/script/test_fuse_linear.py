"""fuse_linear: ``aten::linear`` recovered from the forms a frozen graph holds it in.

    addmm(b, x, W.t())     -> linear(x, W, b)       (torch's pass, W not constant)
    addmm(b, x, C)         -> linear(x, C.t(), b)   (C constant 2-D, beta = alpha = 1)
    matmul(x, C) + b       -> linear(x, C.t(), b)   (b constant 1-D of C's width)
    matmul(x, C)           -> linear(x, C.t())

Counts of ``aten::linear`` (there) and ``aten::addmm`` / ``aten::matmul`` (gone), numerics
against a float64 eager reference, and the forms that are not a linear and stay: scaled addmm,
an add with alpha, a bias that broadcasts, a bias of another dtype, a 3-D or integer matrix,
a matmul whose product is read twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch
from torch import nn

from fxmobile.script.fuse_linear import FuseLinear
from tests.helpers import assert_equivalent
from tests.script.common import CTX, constant_tensor, frozen, kinds, scripted

GONE = {"aten::addmm", "aten::matmul"}


class Linear(nn.Module):
    """Every form at once: ``w`` and ``b`` are parameters, so constants once frozen."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.w = nn.Parameter(torch.randn(5, 4))
        self.b = nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "addmm":
            return torch.addmm(self.b, x, self.w.t())
        if self.form == "matmul + bias":
            return torch.matmul(x, self.w.t()) + self.b
        if self.form == "bias + matmul":
            return self.b + torch.matmul(x, self.w.t())
        return torch.matmul(x, self.w.t())


@pytest.mark.parametrize("form", ["addmm", "matmul + bias", "matmul"])
def test_constant_weight_forms_become_linear(form: str) -> None:
    model = Linear(form).eval()
    result = FuseLinear().call(frozen(model), CTX)
    assert result.rewrites == 1 and result.skips == {}
    after = kinds(result.unit)
    assert after["aten::linear"] == 1 and not GONE & set(after)
    assert after["aten::add"] == 0
    (linear,) = (n for n in result.unit.graph.nodes() if n.kind() == "aten::linear")
    weight = constant_tensor(linear.inputsAt(1))
    assert weight.is_contiguous() and torch.equal(weight, model.w)  # C.t(), made contiguous
    assert_equivalent(model, result.unit, torch.randn(3, 4))


def test_matmul_of_a_batch_becomes_linear() -> None:
    model = Linear("matmul + bias").eval()
    result = FuseLinear().call(frozen(model), CTX)
    assert result.rewrites == 1
    assert_equivalent(model, result.unit, torch.randn(2, 3, 4))


def test_bias_first_is_left_as_an_add_of_a_linear() -> None:
    """``b + matmul(x, C)``: the add's first operand is not the matmul, so the bias stays."""
    model = Linear("bias + matmul").eval()
    result = FuseLinear().call(frozen(model), CTX)
    after = kinds(result.unit)
    assert result.rewrites == 1 and after["aten::linear"] == 1 and after["aten::add"] == 1
    assert_equivalent(model, result.unit, torch.randn(3, 4))


class Unfrozen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 4))
        self.b = nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.b, x, self.w.t()) + torch.matmul(x, self.w.t())


def test_torchs_forms_with_a_transposed_parameter_become_linear() -> None:
    model = Unfrozen().eval()
    result = FuseLinear().call(scripted(model), CTX)
    assert result.rewrites == 2
    assert kinds(result.unit)["aten::linear"] == 2 and not GONE & set(kinds(result.unit))
    assert_equivalent(model, result.unit, torch.randn(3, 4))


class NotLinear(nn.Module):
    if TYPE_CHECKING:  # buffers, for mypy; TorchScript cannot read string annotations
        wi: torch.Tensor

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.w = nn.Parameter(torch.randn(5, 4))
        self.b = nn.Parameter(torch.randn(5))
        self.b1 = nn.Parameter(torch.randn(1))
        self.b64 = nn.Parameter(torch.randn(5, dtype=torch.float64))
        self.w3 = nn.Parameter(torch.randn(2, 4, 5))
        self.register_buffer("wi", torch.randint(-3, 3, (4, 5)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w.t()
        if self.form == "addmm beta 2":
            return torch.addmm(self.b, x, w, beta=2.0)
        if self.form == "addmm alpha 2":
            return torch.addmm(self.b, x, w, alpha=2.0)
        if self.form == "addmm broadcast bias":
            return torch.addmm(self.b1, x, w)
        if self.form == "add alpha 2":
            return torch.add(torch.matmul(x, w), self.b, alpha=2.0)
        if self.form == "add broadcast bias":
            return torch.matmul(x, w) + self.b1
        if self.form == "add float64 bias":
            return torch.matmul(x, w) + self.b64
        if self.form == "add computed bias":
            return torch.matmul(x, w) + x.mean(1, keepdim=True)
        if self.form == "matmul read twice":
            y = torch.matmul(x, w)
            return (y + self.b) * y
        if self.form == "3-D matrix":
            return torch.matmul(x, self.w3)
        return torch.matmul(x.long(), self.wi).float()  # integer matrix


# form -> the aten::linear left in the graph (the bare matmul inside a refused add still fuses)
NOT_LINEAR = {
    "addmm beta 2": 0,
    "addmm alpha 2": 0,
    "addmm broadcast bias": 0,
    "add alpha 2": 1,
    "add broadcast bias": 1,
    "add float64 bias": 1,
    "add computed bias": 1,
    "matmul read twice": 1,
    "3-D matrix": 0,
    "integer matrix": 0,
}


@pytest.mark.parametrize("form", list(NOT_LINEAR))
def test_forms_that_are_not_a_linear_with_bias_stay(form: str) -> None:
    model = NotLinear(form).eval()
    given = frozen(model)
    before = kinds(given)
    result = FuseLinear().call(given, CTX)
    after = kinds(result.unit)
    assert result.rewrites == after["aten::linear"] == NOT_LINEAR[form]
    assert after["aten::add"] == before["aten::add"]  # no bias was taken into a linear
    assert result.skips == {}
    assert_equivalent(model, result.unit, torch.randn(3, 4))


def test_addmm_of_an_unknown_rank_input_that_is_not_a_matrix_stays() -> None:
    """addmm takes 2-D inputs only: a graph input of known other rank is not rewritten."""
    model = Linear("addmm").eval()
    module = frozen(model)
    x = list(module.graph.inputs())[1]
    x.setType(x.type().with_sizes([2, 3, 4]))
    result = FuseLinear().call(module, CTX)
    assert result.rewrites == 0 and kinds(result.unit)["aten::addmm"] == 1


def test_nothing_to_do_reports_zero() -> None:
    result = FuseLinear().call(frozen(nn.Sequential(nn.ReLU())), CTX)
    assert result.rewrites == 0 and not result.modified


class RefusedThenFused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        y = torch.addmm(self.b, m, self.w.t())  # m: made 3-D below, so not a matrix product
        z = torch.addmm(self.b, x, self.w.t(), beta=2.0)  # beta: no linear says it
        return torch.addmm(self.b, z, self.w.t()) + y.sum()


def test_a_form_left_alone_does_not_stop_the_rewrites_after_it() -> None:
    module = frozen(RefusedThenFused().eval())
    m = list(module.graph.inputs())[2]
    m.setType(m.type().with_sizes([2, 3, 4]))
    result = FuseLinear().call(module, CTX)
    assert result.rewrites == 1
    assert kinds(result.unit)["aten::addmm"] == 2 and kinds(result.unit)["aten::linear"] == 1
