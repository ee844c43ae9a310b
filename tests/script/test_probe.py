"""fxmobile.script.probe: one run of a frozen method, facts about values the graph does not type."""

from __future__ import annotations

import torch
from torch import nn

from fxmobile.script.probe import probe
from tests.script.common import frozen


class Net(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.double() + 1
        return y.sum(1)


class Raises(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 2:
            raise ValueError("not this shape")
        return x + 1


def _output_of(module: torch.jit.ScriptModule, kind: str) -> torch._C.Value:
    return next(n for n in module.graph.nodes() if n.kind() == kind).output()


def test_values_and_facts_come_from_one_run_and_the_graph_is_untouched() -> None:
    module = frozen(Net())
    before = str(module.graph)
    x = torch.randn(2, 3)
    y, z = _output_of(module, "aten::add"), _output_of(module, "aten::sum")
    seen = probe(module, module.graph, [y, z], (x,))
    assert seen is not None and [len(seen[y]), len(seen[z])] == [1, 1]
    assert torch.equal(seen[y][0], x.double() + 1) and torch.equal(
        seen[z][0], (x.double() + 1).sum(1)
    )
    facts = [("aten::dim", torch._C.IntType.get()), ("prim::dtype", torch._C.IntType.get())]
    assert probe(module, module.graph, [y], (x,), facts) == {y: [2, 7]}  # 7: float64
    assert str(module.graph) == before


def test_a_graph_that_does_not_run_gives_none_and_nothing_asked_runs_nothing() -> None:
    module = frozen(Raises())
    y = _output_of(module, "aten::add")
    assert probe(module, module.graph, [y], (torch.randn(2, 3),)) is None
    assert probe(module, module.graph, [], (torch.randn(2, 3),)) == {}


def test_the_callers_inputs_are_not_written() -> None:
    class Writes(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.add_(1) * 2

    module = frozen(Writes())
    x = torch.zeros(3)
    seen = probe(module, module.graph, [_output_of(module, "aten::mul")], (x,))
    assert seen is not None and torch.equal(x, torch.zeros(3))


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale

    @torch.jit.export
    def set_scale(self, scale: float) -> None:
        self.scale = scale


def test_an_attribute_a_kept_method_sets_is_read_from_the_module() -> None:
    """Freezing keeps an attribute that a preserved method writes, so the frozen graph still
    reads it from ``self``: the probe must run on the module itself, with its current value."""
    module = frozen(Scaled(), ("set_scale",))
    assert any(n.kind() == "prim::GetAttr" for n in module.graph.nodes())
    module.set_scale(3.0)
    x = torch.randn(4)
    y = _output_of(module, "aten::mul")
    seen = probe(module, module.graph, [y], (x,))
    assert seen is not None and torch.equal(seen[y][0], x * 3.0)
