"""Runs an ordered tuple of passes, recording each one for the report.

``PassManager`` is shared by both stages: it skips blocklisted passes, times and measures each
pass, and when a pass raises, says which pass failed and which passes ran before it. The FX
flavour lints and recompiles the graph after every pass, so a pass that leaves a broken graph is
caught where it happened; the TorchScript flavour (``fxmobile.script.manager``) lints the graphs
of every method it rewrites.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from fxmobile.errors import PassError
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.infra import FxPass, count_nodes, tensor_nbytes
from fxmobile.report.records import PassRecord, Stage, Status

U = TypeVar("U")


class ResultLike(Protocol):
    @property
    def rewrites(self) -> int: ...
    @property
    def skips(self) -> dict[str, int]: ...


class PassManager(abc.ABC, Generic[U]):
    """Applies ``passes`` in order to a unit (a graph module or a script module)."""

    stage: Stage

    def __init__(
        self, passes: Sequence[Any], blocklist: frozenset[MobileOptimizerType] = frozenset()
    ) -> None:
        self.passes = tuple(passes)
        self.blocklist = blocklist

    @abc.abstractmethod
    def apply(self, p: Any, unit: U) -> tuple[U, ResultLike]:
        """Run pass ``p`` on ``unit``; return the unit to carry on with and the pass's result."""

    @abc.abstractmethod
    def measure(self, unit: U) -> tuple[int, int]:
        """(nodes, tensor bytes) of ``unit``, for the before/after columns."""

    def run(self, unit: U) -> tuple[U, list[PassRecord]]:
        records: list[PassRecord] = []
        measured: tuple[int, int] | None = None  # the last pass's "after" is the next "before"
        for p in self.passes:
            if p.blocked_by() & self.blocklist:
                records.append(PassRecord(p.name, self.stage, Status.BLOCKLISTED))
                continue
            nodes_before, bytes_before = measured or self.measure(unit)
            start = time.perf_counter()
            try:
                unit, result = self.apply(p, unit)
            except Exception as exc:
                ran = ", ".join(r.name for r in records if r.status is Status.RAN) or "none"
                member = f"MobileOptimizerType.{p.optimization.name}" if p.optimization else None
                skip = f"Blocklist {member} to skip it, and please" if member else "Please"
                raise PassError(
                    f"fxmobile {self.stage.value} pass {p.name!r} failed: "
                    f"{type(exc).__name__}: {exc}. Passes that ran before it: {ran}. "
                    f"{skip} report the model."
                ) from exc
            seconds = time.perf_counter() - start
            measured = self.measure(unit)
            nodes_after, bytes_after = measured
            records.append(
                PassRecord(
                    name=p.name,
                    stage=self.stage,
                    status=Status.RAN,
                    rewrites=result.rewrites,
                    skips=dict(result.skips),
                    nodes_before=nodes_before,
                    nodes_after=nodes_after,
                    param_bytes_before=bytes_before,
                    param_bytes_after=bytes_after,
                    seconds=seconds,
                )
            )
        return unit, records


class FxPassManager(PassManager[fx.GraphModule]):
    """Runs FX passes; refreshes shapes for passes that need them; lints and recompiles."""

    stage = Stage.FX

    def __init__(
        self,
        passes: Sequence[FxPass],
        blocklist: frozenset[MobileOptimizerType] = frozenset(),
        example_inputs: tuple[object, ...] | None = None,
    ) -> None:
        super().__init__(passes, blocklist)
        self.example_inputs = example_inputs
        self._shapes_fresh = False
        self._propagated: set[fx.Node] = set()

    def apply(self, p: FxPass, unit: fx.GraphModule) -> tuple[fx.GraphModule, ResultLike]:
        if p.needs_shapes and not self._shapes_fresh:
            self._propagate_shapes(unit)
            self._shapes_fresh = True
        with torch.no_grad():
            result = p.call(unit)
        gm = result.graph_module
        gm.graph.lint()
        gm.recompile()
        # A pass that rewrote nothing, or that keeps shapes and added no node,
        # leaves every node's metadata valid.
        if result.rewrites and not (p.keeps_shapes and self._no_new_nodes(gm)):
            self._shapes_fresh = False
        return gm, result

    def measure(self, unit: fx.GraphModule) -> tuple[int, int]:
        return count_nodes(unit), tensor_nbytes(unit)

    def _no_new_nodes(self, gm: fx.GraphModule) -> bool:
        """Every node was there at the last shape propagation (so its metadata is set)."""
        return all(n in self._propagated for n in gm.graph.nodes)

    def _propagate_shapes(self, gm: fx.GraphModule) -> None:
        """Fill ``node.meta["tensor_meta"]`` from the example inputs, when there are some."""
        for node in gm.graph.nodes:
            node.meta.pop("tensor_meta", None)
        if self.example_inputs is None:
            return
        # Clones: a forward that writes to its input must not write to the caller's tensors.
        inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in self.example_inputs]
        with torch.no_grad():
            ShapeProp(gm).propagate(*inputs)
        self._propagated = set(gm.graph.nodes)
