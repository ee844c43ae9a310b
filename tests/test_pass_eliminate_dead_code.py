"""EliminateDeadCode: unused pure work goes; anything that may mutate stays."""

from __future__ import annotations

import torch
from torch import fx, nn

from fxmobile.passes.eliminate_dead_code import EliminateDeadCode
from tests.helpers import assert_equivalent


class Dead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Linear(3, 3)
        self.used = nn.Linear(3, 3)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _ = self.unused(x).sum() * self.scale
        return self.used(x)


class Mutating(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1.5
        self.act(y)  # result unused, but y is changed in place
        y.add_(1)
        torch.relu_(y)
        return y


def _run(model: nn.Module) -> tuple[fx.GraphModule, int, dict[str, int]]:
    gm = fx.symbolic_trace(model)
    result = EliminateDeadCode().call(gm)
    gm.graph.lint()
    gm.recompile()
    return gm, result.rewrites, result.skips


def test_dead_nodes_and_their_modules_and_buffers_are_removed() -> None:
    model = Dead().eval()
    gm, rewrites, _ = _run(model)
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_module", "output"]
    assert not hasattr(gm, "unused") and not hasattr(gm, "scale")
    assert rewrites == 4 + 2  # linear, sum, get_attr, mul; the submodule and the buffer
    assert_equivalent(model, gm, torch.randn(2, 3))


def test_in_place_work_with_unused_results_is_kept() -> None:
    model = Mutating().eval()
    gm, rewrites, skips = _run(model)
    assert rewrites == 0
    assert skips == {
        "unused result of call_module may have side effects": 1,
        "unused result of call_method may have side effects": 1,
        "unused result of call_function may have side effects": 1,
    }
    x = torch.randn(5)
    assert_equivalent(model, gm, x)
