"""The TorchScript-stage pass contract, the twin of ``fxmobile.passes.infra`` for FX.

A ``ScriptPass`` rewrites a frozen (or about-to-be-frozen) ``torch.jit.ScriptModule`` and says
how many rewrites it made, counted from the graphs themselves (nodes of the kinds it creates or
removes), so the count can never claim a change that did not happen.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from fxmobile.options import MobileOptimizerType
from fxmobile.script.graph_utils import count_kinds


@dataclass(frozen=True)
class ScriptContext:
    """What every TorchScript pass needs to know besides the module."""

    methods: tuple[str, ...]  # the methods that are rewritten: forward and the preserved ones
    preserved_attrs: tuple[str, ...]  # what freezing keeps (methods, bundled-input attributes)
    example_inputs: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class ScriptPassResult:
    module: torch.jit.ScriptModule
    rewrites: int
    skips: dict[str, int] = field(default_factory=dict)

    @property
    def modified(self) -> bool:
        return self.rewrites > 0


class ScriptPass(abc.ABC):
    """A rewrite of a ``ScriptModule``; ``optimization`` is None for steps that cannot be
    switched off (freezing)."""

    optimization: ClassVar[MobileOptimizerType | None]
    summary: ClassVar[str]
    pass_name: ClassVar[str | None] = None

    @property
    def name(self) -> str:
        if self.pass_name:
            return self.pass_name
        assert self.optimization is not None
        return self.optimization.name.lower()

    def blocked_by(self) -> frozenset[MobileOptimizerType]:
        return frozenset({self.optimization}) if self.optimization else frozenset()

    @abc.abstractmethod
    def call(self, module: torch.jit.ScriptModule, ctx: ScriptContext) -> ScriptPassResult:
        """Rewrite ``module`` (fxmobile's own clone) and report what changed."""


class CountingScriptPass(ScriptPass):
    """A pass whose rewrites are the change in the number of nodes of some kinds.

    ``created`` kinds count up (``aten::_add_relu`` after add+relu fusion), ``removed`` kinds
    count down (``aten::dropout``); subclasses implement ``rewrite``.
    """

    created: ClassVar[frozenset[str]] = frozenset()
    removed: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    def rewrite(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> torch.jit.ScriptModule: ...

    def call(self, module: torch.jit.ScriptModule, ctx: ScriptContext) -> ScriptPassResult:
        made = count_kinds(module, ctx.methods, set(self.created))
        gone = count_kinds(module, ctx.methods, set(self.removed))
        module = self.rewrite(module, ctx)
        made = count_kinds(module, ctx.methods, set(self.created)) - made
        gone = gone - count_kinds(module, ctx.methods, set(self.removed))
        return ScriptPassResult(module, max(made, 0) + max(gone, 0))
