"""The TorchScript stage's side of the pass contract: a ``CountingScriptPass`` counts its
rewrites from the graphs (created kinds up, removed kinds down, never below zero), and
``ScriptStage`` lints every rewritten method and measures nodes and tensor bytes.

The counting pass here is a minimal subclass: fxmobile's own counting passes (``RemoveDropout``,
``FuseLinear``) each only create or only remove, so the sum of both and the "never below zero"
guard cannot be told apart through them."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from torch import nn

from fxmobile.errors import PassError
from fxmobile.infra import PassManager, PassResult
from fxmobile.script.quiet_script import quietly_script
from fxmobile.script.stage import CountingScriptPass, ScriptContext, ScriptPass, ScriptStage
from tests.script.common import CTX, kinds


class TwoSigmoids(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + torch.sigmoid(x) + torch.sigmoid(x * 2)


class OneSigmoid(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + torch.relu(x) + torch.sigmoid(x * 2)


class SigmoidToRelu(CountingScriptPass):
    """Turns ``TwoSigmoids`` into ``OneSigmoid``: one relu made, one sigmoid gone, one sigmoid
    left (a skip), when the context says forward is the method to rewrite; anything else it
    leaves alone."""

    summary = "sigmoid(x) -> relu(x), the first one"
    created: ClassVar[frozenset[str]] = frozenset({"aten::relu"})
    removed: ClassVar[frozenset[str]] = frozenset({"aten::sigmoid"})

    def rewrite(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> tuple[torch.jit.ScriptModule, dict[str, int]]:
        if module.original_name == "TwoSigmoids" and ctx.methods == ("forward",):
            return quietly_script(OneSigmoid()), {"second sigmoid kept": 1}
        return module, {}


def test_a_counting_pass_counts_kinds_made_and_kinds_gone() -> None:
    """A relu already there and a sigmoid still there after the pass count for nothing."""
    module = quietly_script(TwoSigmoids())
    assert (kinds(module)["aten::relu"], kinds(module)["aten::sigmoid"]) == (1, 2)
    result = SigmoidToRelu().call(module, CTX)
    assert (result.rewrites, dict(result.skips)) == (2, {"second sigmoid kept": 1})
    assert (kinds(result.unit)["aten::relu"], kinds(result.unit)["aten::sigmoid"]) == (2, 1)


def test_a_counting_pass_that_changed_nothing_counts_zero() -> None:
    module = quietly_script(OneSigmoid())
    result = SigmoidToRelu().call(module, CTX)
    assert (result.rewrites, result.modified, result.unit) == (0, False, module)


class Undoes(CountingScriptPass):
    """Turns ``OneSigmoid`` back into ``TwoSigmoids``: fewer created kinds and more removed
    kinds than before; neither is a rewrite it made."""

    summary = "relu(x) -> sigmoid(x)"
    created: ClassVar[frozenset[str]] = frozenset({"aten::relu"})
    removed: ClassVar[frozenset[str]] = frozenset({"aten::sigmoid"})

    def rewrite(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> tuple[torch.jit.ScriptModule, dict[str, int]]:
        return quietly_script(TwoSigmoids()), {}


def test_a_counting_pass_never_counts_below_zero() -> None:
    result = Undoes().call(quietly_script(OneSigmoid()), CTX)
    assert result.rewrites == 0


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc(x)) * 2

    @torch.jit.export
    def halved(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x) / 2


class BreaksHalf(ScriptPass):
    """Leaves ``halved``'s graph failing its lint: a node reads a value defined after it."""

    summary = "breaks the graph of halved"

    def call(
        self, unit: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        graph = unit._c._get_method("halved").graph
        sigmoid = next(n for n in graph.nodes() if n.kind() == "aten::sigmoid")
        div = next(n for n in graph.nodes() if n.kind() == "aten::div")
        div.moveBefore(sigmoid)  # div now reads sigmoid's output before it is made
        return PassResult(unit, 1)


def test_the_stage_lints_every_rewritten_method_after_each_pass() -> None:
    """A broken graph in a preserved method is caught after the pass that broke it; a method
    the stage does not rewrite is not its business."""
    ctx = ScriptContext(("forward", "halved"), ("halved",))
    with pytest.raises(PassError, match=r"script pass '\w*test_stage' failed: RuntimeError: "):
        PassManager([BreaksHalf()], ScriptStage(ctx), ctx).run(quietly_script(Scaled()))
    forward_only = ScriptContext(("forward",), ())
    PassManager([BreaksHalf()], ScriptStage(forward_only), forward_only).run(
        quietly_script(Scaled())
    )


def test_the_stage_measures_the_nodes_and_tensor_bytes_of_every_rewritten_method() -> None:
    module = quietly_script(Scaled())
    only_forward = ScriptStage(ScriptContext(("forward",), ()))
    both = ScriptStage(ScriptContext(("forward", "halved"), ("halved",)))
    nodes, size = only_forward.measure(module)
    assert size == (16 + 4) * 4  # the linear's weight and bias, in float32
    more_nodes, _ = both.measure(module)
    assert more_nodes > nodes > 0
