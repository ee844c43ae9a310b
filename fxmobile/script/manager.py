"""Runs TorchScript passes in order, recording each one (see ``fxmobile.passes.manager``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fxmobile.options import MobileOptimizerType
from fxmobile.passes.manager import PassManager, ResultLike
from fxmobile.report.records import Stage
from fxmobile.script.graph_utils import method_graphs, node_count, tensor_bytes
from fxmobile.script.infra import ScriptContext, ScriptPass


class ScriptPassManager(PassManager[torch.jit.ScriptModule]):
    stage = Stage.SCRIPT

    def __init__(
        self,
        passes: Sequence[ScriptPass],
        ctx: ScriptContext,
        blocklist: frozenset[MobileOptimizerType] = frozenset(),
    ) -> None:
        super().__init__(passes, blocklist)
        self.ctx = ctx

    def apply(
        self, p: ScriptPass, unit: torch.jit.ScriptModule
    ) -> tuple[torch.jit.ScriptModule, ResultLike]:
        result = p.call(unit, self.ctx)
        for graph in method_graphs(result.module, self.ctx.methods):
            graph.lint()
        return result.module, result

    def measure(self, unit: torch.jit.ScriptModule) -> tuple[int, int]:
        return node_count(unit, self.ctx.methods), tensor_bytes(unit, self.ctx.methods)
