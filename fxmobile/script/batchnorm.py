"""What the TorchScript BatchNorm passes share: matching ``aten::batch_norm`` in a frozen graph,
and the input ranks they need.

A BatchNorm normalizes dim 1 of its input, with one statistic per feature. Whether that is a
producer's output channel depends on the input's rank (a conv's output is ``[N, C, ...]`` only
for a batched input; a linear's features are dim 1 only for a 2-D output), which a frozen graph
does not record (freezing erases even a traced graph's ranks). For the output of
``aten::conv{N}d`` the rank is N + 2, the rank TorchScript's own peephole optimizer gives it (it
folds ``dim()`` of a convolution's output to that constant, which is how a scripted
``BatchNorm2d``'s rank check after a conv disappears at compile time); else it comes from such a
check where it stays (``if x.dim() != 4: raise`` before the BatchNorm, in its block), or from one
run of ``forward`` on the example inputs (``fxmobile.script.probe``: each top-level BatchNorm
input's ``dim()``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxmobile.script.graph_utils import NOT_CONSTANT, constant, iter_nodes, method_graphs
from fxmobile.script.probe import probe
from fxmobile.script.stage import ScriptContext

_ARGS = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")


@dataclass(frozen=True)
class FrozenBatchNorm:
    """An inference ``aten::batch_norm`` whose statistics are constants."""

    node: torch._C.Node
    mean: torch.Tensor
    var: torch.Tensor
    gamma: torch.Tensor | None
    beta: torch.Tensor | None
    eps: float

    @property
    def input(self) -> torch._C.Value:
        return self.node.inputsAt(0)

    def scale_shift(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``s = gamma / sqrt(var + eps)`` and ``t = beta - mean * s``, in float64."""
        f64 = torch.float64
        var = self.var.to(f64)
        gamma = torch.ones_like(var) if self.gamma is None else self.gamma.to(f64)
        beta = torch.zeros_like(var) if self.beta is None else self.beta.to(f64)
        s = gamma / torch.sqrt(var + self.eps)
        return s, beta - self.mean.to(f64) * s


# The convolutions whose output rank TorchScript's peephole optimizer takes as known.
_CONV_RANKS = {"aten::conv1d": 3, "aten::conv2d": 4, "aten::conv3d": 5}


def match(node: torch._C.Node) -> FrozenBatchNorm | str | None:
    """``node`` as an inference BatchNorm with constant statistics, why it is not one, or None
    when it is no BatchNorm."""
    if node.kind() != "aten::batch_norm":
        return None
    values = dict(zip(_ARGS, [constant(v) for v in node.inputs()], strict=False))
    if values["training"] is not False:
        return "BN in training mode, or its training flag is not a constant"
    if not isinstance(values["eps"], float | int):
        return "BN eps is not a constant"
    mean, var = values["running_mean"], values["running_var"]
    if not isinstance(mean, torch.Tensor) or not isinstance(var, torch.Tensor):
        return "BN has no constant running stats"
    gamma, beta = values["weight"], values["bias"]
    if gamma is NOT_CONSTANT or beta is NOT_CONSTANT:
        return "BN affine params are not constants"
    return FrozenBatchNorm(node, mean, var, gamma, beta, float(values["eps"]))


def batchnorms(
    module: torch.jit.ScriptModule, methods: Sequence[str]
) -> Iterator[tuple[torch._C.Graph, FrozenBatchNorm | str]]:
    """Every ``aten::batch_norm`` of ``methods``, matched (``match``), with its graph; each graph's
    nodes are listed before the first is yielded, so the caller may rewrite as it goes."""
    for graph in method_graphs(module, methods):
        for node in list(iter_nodes(graph)):
            bn = match(node)
            if bn is not None:
                yield graph, bn


def input_ranks(module: torch.jit.ScriptModule, ctx: ScriptContext) -> dict[torch._C.Value, int]:
    """The rank of each BatchNorm input that can be known: from its producer (a convolution), a
    rank check before it, or a run of ``forward`` on the example inputs (top-level BatchNorms of
    ``forward`` only)."""
    ranks: dict[torch._C.Value, int] = {}
    for name in ctx.methods:
        for node in iter_nodes(module._c._get_method(name).graph):
            if node.kind() == "aten::batch_norm":
                dim = _CONV_RANKS.get(node.inputsAt(0).node().kind())
                if dim is None:
                    dim = _checked_rank(node)
                if dim is not None:
                    ranks[node.inputsAt(0)] = dim
    if ctx.example_inputs is not None and "forward" in ctx.methods:
        ranks.update(_probed_ranks(module, ctx.example_inputs))
    return ranks


def _checked_rank(bn: torch._C.Node) -> int | None:
    """k when ``bn`` follows, in its block, ``if input.dim() != k: raise``."""
    for use in bn.inputsAt(0).uses():
        if use.user.kind() != "aten::dim":
            continue
        for compared in use.user.output().uses():
            test = compared.user
            if test.kind() != "aten::ne":
                continue
            k = constant(test.inputsAt(1 - compared.offset))
            if not isinstance(k, int) or isinstance(k, bool):
                continue
            for branch in test.output().uses():
                guard = branch.user
                if (
                    guard.kind() == "prim::If"
                    and guard.owningBlock() == bn.owningBlock()
                    and guard.isBefore(bn)
                    and _raises(next(iter(guard.blocks())))
                ):
                    return k
    return None


def _raises(block: torch._C.Block) -> bool:
    return any(n.kind() == "prim::RaiseException" for n in block.nodes())


def _probed_ranks(module: torch.jit.ScriptModule, inputs: Sequence[Any]) -> dict[Any, int]:
    graph = module._c._get_method("forward").graph
    targets = [n.inputsAt(0) for n in graph.nodes() if n.kind() == "aten::batch_norm"]
    found = probe(module, graph, targets, inputs, [("aten::dim", torch._C.IntType.get())])
    return {value: dims[0] for value, dims in (found or {}).items()}
