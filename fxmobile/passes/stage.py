"""The FX stage's side of the pass contract (``fxmobile.infra``): ``FxPass`` and ``FxStage``.

FX passes rewrite the ``GraphModule`` they are given in place (always fxmobile's own copy of the
user's model). ``FxStage`` lints the graph after every pass and recompiles it after every pass
that changed it, so a pass that leaves a broken graph is caught where it happened, and keeps
``node.meta["tensor_meta"]`` fresh for the passes that read shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from fxmobile.infra import Pass, PassResult
from fxmobile.report.records import Stage


@dataclass(frozen=True)
class FxContext:
    """What every FX pass may read besides the graph module."""

    example_inputs: tuple[Any, ...] | None = None

    @property
    def shapes_known(self) -> bool:
        """Whether shape propagation ran (passes that read shapes decline without it)."""
        return self.example_inputs is not None


class FxPass(Pass[fx.GraphModule, FxContext]):
    """A rewrite of a ``torch.fx.GraphModule``.

    A pass that reads tensor shapes sets ``needs_shapes``: the stage then refreshes
    ``node.meta["tensor_meta"]`` before it runs, when example inputs were given, and the pass
    treats nodes without that metadata as "shape unknown" rather than guessing. A pass that
    only reroutes users to a value of the same shape, dtype and layout (a removal, a fold into a
    producer) sets ``keeps_shapes``: the metadata stays valid after it, so the next pass that
    needs shapes does not run the model again.
    """

    needs_shapes: ClassVar[bool] = False
    keeps_shapes: ClassVar[bool] = False


class FxStage:
    """Refreshes shapes for passes that need them; lints after every pass and recompiles after
    every pass that changed the graph."""

    stage = Stage.FX

    def __init__(self, example_inputs: tuple[Any, ...] | None) -> None:
        self.example_inputs = example_inputs
        self._shapes_fresh = False
        self._propagated: set[fx.Node] = set()
        self._before: tuple[fx.Graph, list[tuple[Any, ...]]] | None = None

    def before(self, p: Pass[fx.GraphModule, FxContext], unit: fx.GraphModule) -> None:
        """Propagate shapes when ``p`` reads them and they are stale; note the graph as it is."""
        if getattr(p, "needs_shapes", False) and not self._shapes_fresh:
            self._propagate_shapes(unit)
            self._shapes_fresh = True
        self._before = (unit.graph, _code_inputs(unit.graph))

    def after(
        self, p: Pass[fx.GraphModule, FxContext], result: PassResult[fx.GraphModule]
    ) -> fx.GraphModule:
        """Lint, and recompile unless the graph is as it was before ``p`` (generating and
        compiling the code costs about 4 ms per pass on resnet50); a pass that rewrote something
        may leave shapes stale."""
        gm = result.unit
        gm.graph.lint()
        if not self._unchanged(gm.graph):
            gm.recompile()
        # A pass that rewrote nothing, or that keeps shapes and added no node,
        # leaves every node's metadata valid.
        keeps = getattr(p, "keeps_shapes", False) and self._no_new_nodes(gm)
        if result.rewrites and not keeps:
            self._shapes_fresh = False
        return gm

    def measure(self, unit: fx.GraphModule) -> tuple[int, int]:
        """(nodes that do work, bytes of parameters and buffers)."""
        return count_nodes(unit), tensor_nbytes(unit)

    def _unchanged(self, graph: fx.Graph) -> bool:
        """Whether ``graph`` is the graph ``before`` saw, with the same code inputs."""
        if self._before is None or self._before[0] is not graph:
            return False
        try:
            return bool(self._before[1] == _code_inputs(graph))
        except RuntimeError:  # a tensor in an argument: == is ambiguous, so say changed
            return False

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


def _code_inputs(graph: fx.Graph) -> list[tuple[Any, ...]]:
    """What the generated code of ``graph`` is made from: each node's kind, target, name,
    arguments (nodes compare by identity) and type annotation, in order."""
    return [(n.op, n.target, n.name, n.args, n.kwargs, n.type) for n in graph.nodes]


def tensor_nbytes(gm: torch.nn.Module) -> int:
    """Bytes held by the parameters and buffers of ``gm``, each storage counted once."""
    seen: set[int] = set()
    total = 0
    for t in [*gm.parameters(), *gm.buffers()]:
        key = t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def count_nodes(gm: fx.GraphModule) -> int:
    """Nodes that do work: everything but placeholders and the output node."""
    return sum(1 for n in gm.graph.nodes if n.op not in ("placeholder", "output"))
