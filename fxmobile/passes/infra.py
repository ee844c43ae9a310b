"""The pass contract: every FX pass is an ``FxPass`` whose ``call`` returns a ``PassResult``.

A result carries how many rewrites the pass made and, for each reason it declined a candidate,
how many times (``{"conv output has 2 users": 3}``). ``modified`` is derived from the count, so
no pass can claim a change it did not make. Passes rewrite the ``GraphModule`` they are given in
place (it is always fxmobile's own copy of the user's model); the manager lints and recompiles.
"""

from __future__ import annotations

import abc
from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import fx

from fxmobile.options import MobileOptimizerType


@dataclass(frozen=True)
class PassResult:
    """What one pass did to one graph module."""

    graph_module: fx.GraphModule
    rewrites: int
    skips: dict[str, int] = field(default_factory=dict)

    @property
    def modified(self) -> bool:
        return self.rewrites > 0


class Skips(Counter[str]):
    """Counts the reasons a pass gave up on a candidate, in the order first seen."""

    def add(self, reason: str) -> None:
        self[reason] += 1


class FxPass(abc.ABC):
    """A rewrite of a ``torch.fx.GraphModule``.

    Subclasses set ``optimization`` (the blocklist member that switches them off), ``summary``
    (``before -> after``, shown in the README and the report) and implement ``call``. A pass
    that reads tensor shapes sets ``needs_shapes``: the manager then refreshes
    ``node.meta["tensor_meta"]`` before it runs, when example inputs were given, and the pass
    treats nodes without that metadata as "shape unknown" rather than guessing. A pass that
    only reroutes users to a value of the same shape, dtype and layout (a removal, a fold into a
    producer) sets ``keeps_shapes``: the metadata stays valid after it, so the next pass that
    needs shapes does not run the model again.
    """

    optimization: ClassVar[MobileOptimizerType]
    summary: ClassVar[str]
    needs_shapes: ClassVar[bool] = False
    keeps_shapes: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.optimization.name.lower()

    @abc.abstractmethod
    def call(self, gm: fx.GraphModule) -> PassResult:
        """Rewrite ``gm`` in place and say how many rewrites were made and why others were not."""

    def blocked_by(self) -> frozenset[MobileOptimizerType]:
        """The blocklist members that switch this pass off (by default, its own member)."""
        return frozenset({self.optimization})


def tensor_nbytes(gm: torch.nn.Module) -> int:
    """Bytes held by the parameters and buffers of ``gm``, each storage counted once."""
    seen: set[int] = set()
    total = 0
    tensors = [*gm.parameters(), *gm.buffers()]
    for t in tensors:
        key = t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def count_nodes(gm: fx.GraphModule) -> int:
    """Nodes that do work: everything but placeholders and the output node."""
    return sum(1 for n in gm.graph.nodes if n.op not in ("placeholder", "output"))
