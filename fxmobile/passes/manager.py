"""Runs an ordered tuple of passes, recording each one for the report.

After every pass the manager lints the graph and recompiles the module, so a pass that leaves
a broken graph is caught where it happened. When a pass raises, the error says which pass failed
and which passes ran before it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from fxmobile.errors import PassError
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.infra import FxPass, count_nodes, tensor_nbytes
from fxmobile.report.records import PassRecord, Stage, Status


class PassManager:
    """Applies ``passes`` in order, skipping those switched off by ``blocklist``."""

    def __init__(
        self,
        passes: Sequence[FxPass],
        blocklist: frozenset[MobileOptimizerType] = frozenset(),
        example_inputs: tuple[object, ...] | None = None,
    ) -> None:
        self.passes = tuple(passes)
        self.blocklist = blocklist
        self.example_inputs = example_inputs

    def run(self, gm: fx.GraphModule) -> tuple[fx.GraphModule, list[PassRecord]]:
        records: list[PassRecord] = []
        for p in self.passes:
            if p.blocked_by() & self.blocklist:
                records.append(PassRecord(p.name, Stage.FX, Status.BLOCKLISTED))
                continue
            nodes_before, bytes_before = count_nodes(gm), tensor_nbytes(gm)
            start = time.perf_counter()
            try:
                if p.needs_shapes:
                    self._propagate_shapes(gm)
                with torch.no_grad():
                    result = p.call(gm)
                gm = result.graph_module
                gm.graph.lint()
                gm.recompile()
            except Exception as exc:
                ran = ", ".join(r.name for r in records if r.status is Status.RAN) or "none"
                raise PassError(
                    f"fxmobile pass {p.name!r} failed: {type(exc).__name__}: {exc}. "
                    f"Passes that ran before it: {ran}. Blocklist "
                    f"MobileOptimizerType.{p.optimization.name} to skip it, and please report "
                    f"the model."
                ) from exc
            records.append(
                PassRecord(
                    name=p.name,
                    stage=Stage.FX,
                    status=Status.RAN,
                    rewrites=result.rewrites,
                    skips=dict(result.skips),
                    nodes_before=nodes_before,
                    nodes_after=count_nodes(gm),
                    param_bytes_before=bytes_before,
                    param_bytes_after=tensor_nbytes(gm),
                    seconds=time.perf_counter() - start,
                )
            )
        return gm, records

    def _propagate_shapes(self, gm: fx.GraphModule) -> None:
        """Fill ``node.meta["tensor_meta"]`` from the example inputs, when there are some."""
        for node in gm.graph.nodes:
            node.meta.pop("tensor_meta", None)
        if self.example_inputs is None:
            return
        with torch.no_grad():
            ShapeProp(gm).propagate(*self.example_inputs)
