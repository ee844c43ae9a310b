"""EliminateDeadCode: unused pure work goes; anything that may mutate stays."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import fx, nn

import fxmobile
from fxmobile.passes.eliminate_dead_code import EliminateDeadCode
from fxmobile.passes.stage import FxContext
from tests.helpers import assert_equivalent, count_calls


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


def _run(model: nn.Module) -> tuple[fx.GraphModule, int, Mapping[str, int]]:
    gm = fx.symbolic_trace(model)
    result = EliminateDeadCode().call(gm, FxContext())
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


class IgnoresAnInput(nn.Module):
    def forward(self, x: torch.Tensor, unused: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_an_input_nothing_reads_stays_in_the_signature() -> None:
    """The caller still passes it: removing the placeholder would shift the arguments (and an
    input is no side effect to report)."""
    model = IgnoresAnInput()
    gm, rewrites, skips = _run(model)
    assert skips == {}
    assert [n.op for n in gm.graph.nodes] == [
        "placeholder",
        "placeholder",
        "call_function",
        "output",
    ]
    assert rewrites == 0
    x, other = torch.randn(3), torch.randn(3)
    assert torch.equal(gm(x, other), model(x, other))


class MarkedImpure(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.log = nn.ReLU()
        vars(self.log)["_is_impure"] = True  # torch.fx's mark: "calling me has effects"
        self.plain = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log(x)
        self.plain(x)
        return x * 2


def test_a_module_marked_impure_is_kept_when_its_result_is_unused() -> None:
    gm, rewrites, skips = _run(MarkedImpure().eval())
    assert [str(n.target) for n in gm.graph.nodes if n.op == "call_module"] == ["log"]
    assert rewrites == 1 + 1  # plain's call, then the submodule nothing calls
    assert skips == {"unused result of call_module may have side effects": 1}


class TwoDeadBuffers(nn.Module):
    a: torch.Tensor
    b: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.ones(2))
        self.register_buffer("b", torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _ = x + self.a + self.b
        return x * 2


def test_each_attribute_removed_is_counted() -> None:
    gm, rewrites, _ = _run(TwoDeadBuffers())
    assert not hasattr(gm, "a") and not hasattr(gm, "b")
    assert rewrites == 4 + 2  # two get_attr and two adds; the two buffers


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


def _add_into(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Writes into ``x``, like torchvision mvit's fx-wrapped ``_add_shortcut``."""
    x.add_(y)
    return x


torch.fx.wrap("_add_into")


class WrappedWriter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        _add_into(y, x)  # result unused: only the write matters
        return y * 2


def test_wrapped_user_function_that_writes_is_kept() -> None:
    """mvit_v2_s came out 143% off: dead-code elimination removed the unused result of an
    fx-wrapped function that writes in place (found by the zoo runner)."""
    torch.manual_seed(0)
    model = WrappedWriter().eval()
    x = torch.randn(1, 2, 4, 4)
    result = fxmobile.optimize_fx(model, x)
    assert count_calls(result.graph_module, _add_into) == 1
    assert_equivalent(model, result.graph_module, x)


class BatchNormIntoBuffers(nn.Module):
    normed: torch.Tensor
    mean: torch.Tensor
    invstd: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        for name, shape in (("normed", (4, 3)), ("mean", (3,)), ("invstd", (3,))):
            self.register_buffer(name, torch.zeros(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = (self.normed, self.mean, self.invstd)
        torch.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5, out=out)
        return x + self.normed


def test_an_op_writing_a_tuple_of_outs_is_kept() -> None:
    """``out=`` given as a tuple was not seen as a write, so the call (its result unused) was
    removed and the model returned ``x + 0`` (found by mutation testing of fold_constants)."""
    model = BatchNormIntoBuffers().eval()
    gm, _, _ = _run(model)
    assert count_calls(gm, torch.native_batch_norm) == 1
    assert_equivalent(copy.deepcopy(model), gm, torch.randn(4, 3))
