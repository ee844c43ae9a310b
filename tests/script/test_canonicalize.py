"""canonicalize: dead code, common subexpressions, peephole, constants, as upstream runs them.

The count is the number of nodes that do work that went. Counts of the kinds left after each
clean-up, numerics against a float64 eager reference, and graphs with nothing to clean, which
report zero.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fxmobile.script.canonicalize import Canonicalize
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.script.common import CTX, frozen, kinds


class Sine(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2


def twin_sine(module: torch.jit.ScriptModule, method: str = "forward") -> None:
    """A second ``sin`` of the same input feeding the ``mul``: what an earlier rewrite may
    leave, and common subexpression elimination removes."""
    graph = module._c._get_method(method).graph
    sin = graph.findNode("aten::sin")
    with graph.insert_point_guard(sin):
        twin = graph.insert("aten::sin", [sin.inputsAt(0)])
    graph.findNode("aten::mul").replaceInput(0, twin)


def test_common_subexpressions_are_removed() -> None:
    module = frozen(Sine())
    twin_sine(module)
    assert kinds(module)["aten::sin"] == 2
    result = Canonicalize().call(module, CTX)
    assert result.rewrites == 1 and result.skips == {}
    assert kinds(result.unit)["aten::sin"] == 1
    assert_equivalent(Sine(), result.unit, torch.randn(5))


def test_dead_code_is_removed_and_constant_arithmetic_folded() -> None:
    module = frozen(Sine())
    graph = module.graph
    g: Any = graph  # torch's stubs omit Graph.insert's list form and insertConstant
    mul = graph.findNode("aten::mul")  # type: ignore[attr-defined]  # torch's stub lacks it
    a, b = torch.randn(5), torch.randn(5)
    with graph.insert_point_guard(mul):
        g.insert("aten::exp", [list(graph.inputs())[1]])  # dead: nothing reads it
        product = g.insert("aten::mul", [g.insertConstant(a), g.insertConstant(b)])
    ret = graph.return_node()
    with graph.insert_point_guard(ret):
        total = g.insert("aten::add", [ret.inputsAt(0), product])
    ret.replaceInput(0, total)
    before = kinds(module)
    assert before["aten::exp"] == 1 and before["aten::mul"] == 2
    result = Canonicalize().call(module, CTX)
    after = kinds(result.unit)
    assert result.rewrites == 2  # the exp went, and a * b became a constant
    assert after["aten::exp"] == 0 and after["aten::mul"] == 1 and after["aten::add"] == 1
    x = torch.randn(5)
    torch.testing.assert_close(result.unit(x), torch.sin(x) * 2 + a * b)


def test_every_rewritten_method_is_cleaned() -> None:
    class WithExport(Sine):
        @torch.jit.export
        def other(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sin(x) * 2

    model = WithExport()
    module = frozen(model, ("other",))
    twin_sine(module)
    twin_sine(module, "other")
    result = Canonicalize().call(module, ScriptContext(("forward", "other"), ("other",)))
    assert result.rewrites == 2
    assert kinds(result.unit, "other")["aten::sin"] == 1
    x = torch.randn(5)
    assert_equivalent(model.other, result.unit.other, x)


def test_a_clean_graph_reports_zero() -> None:
    module = frozen(nn.Sequential(nn.Linear(2, 2)))
    result = Canonicalize().call(module, CTX)
    assert result.rewrites == 0 and not result.modified and result.skips == {}
