"""The TorchScript stage's side of the pass contract (``fxmobile.infra``).

A ``ScriptPass`` rewrites a frozen (or about-to-be-frozen) ``torch.jit.ScriptModule``. Counts
come from the graphs themselves (nodes of the kinds a pass creates or removes), so a count can
never claim a change that did not happen. ``ScriptStage`` lints the graph of every method the
stage rewrites after each pass.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fxmobile.infra import Pass, PassResult
from fxmobile.report.records import Stage
from fxmobile.script.graph_utils import count_kinds, method_graphs, node_count, tensor_bytes


@dataclass(frozen=True)
class ScriptContext:
    """What every TorchScript pass needs to know besides the module."""

    methods: tuple[str, ...]  # the methods that are rewritten: forward and the preserved ones
    preserved_attrs: tuple[str, ...]  # what freezing keeps (methods, bundled-input attributes)
    example_inputs: tuple[Any, ...] | None = None
    # operators the target runtime does not have (its RuntimeSpec.lacks): passes write them out
    missing_ops: frozenset[str] = frozenset()


ScriptPass = Pass[torch.jit.ScriptModule, ScriptContext]


class ScriptStage:
    """Lints every rewritten method's graph after each pass; measures nodes and tensor bytes."""

    stage = Stage.SCRIPT

    def __init__(self, ctx: ScriptContext) -> None:
        self.ctx = ctx

    def before(self, p: ScriptPass, unit: torch.jit.ScriptModule) -> None:
        """Nothing to prepare: TorchScript graphs carry their own types."""

    def after(
        self, p: ScriptPass, result: PassResult[torch.jit.ScriptModule]
    ) -> torch.jit.ScriptModule:
        """Lint the graph of every rewritten method."""
        for graph in method_graphs(result.unit, self.ctx.methods):
            graph.lint()
        return result.unit

    def measure(self, unit: torch.jit.ScriptModule) -> tuple[int, int]:
        """(nodes that do work, tensor bytes held by the module and its constants)."""
        return node_count(unit, self.ctx.methods), tensor_bytes(unit, self.ctx.methods)


class CountingScriptPass(ScriptPass):
    """A pass whose rewrites are the change in the number of nodes of some kinds.

    ``created`` kinds count up (``aten::_add_relu`` after add+relu fusion), ``removed`` kinds
    count down (``aten::dropout``); subclasses implement ``rewrite`` and may return skip
    reasons from it.
    """

    created: ClassVar[frozenset[str]] = frozenset()
    removed: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    def rewrite(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> tuple[torch.jit.ScriptModule, dict[str, int]]:
        """Rewrite ``module``; the module and the reasons candidates were left alone."""

    def call(
        self, unit: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        """Count the kinds before and after ``rewrite``."""
        made = count_kinds(unit, ctx.methods, set(self.created))
        gone = count_kinds(unit, ctx.methods, set(self.removed))
        unit, skips = self.rewrite(unit, ctx)
        made = count_kinds(unit, ctx.methods, set(self.created)) - made
        gone = gone - count_kinds(unit, ctx.methods, set(self.removed))
        return PassResult(unit, max(made, 0) + max(gone, 0), skips)
