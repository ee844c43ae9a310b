"""Decompose an inference BatchNorm that could not be folded into a per-channel multiply-add.

    y = BatchNorm(x)                          ->  y = x * s + t
    y = F.batch_norm(x, mean, var, gamma, beta, training=False, eps=eps)   (same)

    s = gamma / sqrt(var + eps)        t = beta - mean * s       (gamma = 1, beta = 0 if not affine)

``s`` and ``t`` are computed in float64 and stored in the BN's dtype as buffers shaped to
broadcast over the channel axis (dim 1): ``[C, 1, ..., 1]`` with ``rank - 2`` ones. It runs after
the BN folding pass, so only BNs without a foldable producer are left, and no ``batch_norm`` op
reaches the mobile graph.

The input rank fixes that shape. BatchNorm2d and BatchNorm3d only accept 4-D and 5-D input, but
BatchNorm1d takes ``[N, C]`` or ``[N, C, L]`` and ``F.batch_norm`` any rank from 2: there the rank
comes from shape propagation, and when it is unknown the pass emits a form correct for every rank,

    y = (x.unsqueeze(-1).flatten(2) * s + t).view_as(x)        s, t: [C, 1]

``unsqueeze(-1).flatten(2)`` turns ``[N, C, *rest]`` into ``[N, C, prod(rest)]`` (``[N, C]`` into
``[N, C, 1]``) without copying a contiguous input, and ``view_as`` restores the shape.

``x * s + t`` is emitted rather than ``torch.addcmul(t, x, s)``: on a contiguous [1, 64, 56, 56]
float32 input, one thread, it took 43 us against 97 us (eager and frozen TorchScript alike; only
on a channels-last input was addcmul faster, 25 us against 41 us).

BatchNorms are matched by ``fxmobile.passes.matchers`` (module and functional forms, exact
types, no hooks). Left alone, with a reason: what the matcher refuses (a BN in training mode, a
BN without running statistics, ``track_running_stats=False``: eval mode still normalizes by the
batch statistics, pytorch#71259; a functional ``batch_norm`` whose ``training`` is not the
constant False or whose statistics are not ``get_attr`` tensors; a subclass or a hooked BN);
and an input whose dtype differs from the BN's
(``batch_norm`` computes a float16 input with float32 statistics in float32 and returns float16;
``x * s + t`` would return float32). Without shape propagation the input dtype is taken to be the
BN's own, the dtype a model converted with ``.half()`` or ``.double()`` has.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import ClassVar

from torch import fx

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.graph_utils import (
    add_constant,
    erase_unused_attributes,
    replace_node,
    tensor_meta,
)
from fxmobile.passes.matchers import BatchNormCall, match_batchnorm
from fxmobile.passes.stage import FxContext, FxPass

# (BN name, input rank) -> names of its scale and shift buffers
BufferCache = dict[tuple[str, int | None], tuple[str, str]]


def can_decompose(gm: fx.GraphModule, node: fx.Node) -> BatchNormCall | str | None:
    """The BN ``node`` computes, a reason it must stay, or None when it is no BatchNorm."""
    match = match_batchnorm(gm, node)
    if match is None or isinstance(match, str):
        return match
    meta = tensor_meta(match.source)
    if not hasattr(meta, "shape"):
        return match  # no shape propagation: rank from the module type, or unknown
    dtype = match.mean.dtype
    if meta.dtype != dtype:
        return f"BN input dtype {meta.dtype} differs from its statistics' {dtype}"
    return dataclasses.replace(match, ranks=frozenset({len(meta.shape)}))


def decompose(gm: fx.GraphModule, match: BatchNormCall, buffers: BufferCache) -> fx.Node:
    """Insert ``x * s + t`` (or the rank-agnostic form) before the BN node; return its output.

    ``buffers`` maps (BN name, rank) to the buffers made for it, so that a BN module called at
    several sites stores ``s`` and ``t`` once.
    """
    rank = match.rank
    key = (match.name, rank)
    if key not in buffers:
        s, t = match.scale_shift()
        dtype = match.mean.dtype
        shape = (-1, *[1] * ((rank if rank is not None else 3) - 2))
        buffers[key] = (
            add_constant(gm, f"{match.name}_scale", s.reshape(shape).to(dtype)),
            add_constant(gm, f"{match.name}_shift", t.reshape(shape).to(dtype)),
        )
    s_name, t_name = buffers[key]
    graph = gm.graph
    with graph.inserting_before(match.node):
        x: fx.Node = match.source
        if rank is None:
            x = graph.call_method("flatten", (graph.call_method("unsqueeze", (x, -1)), 2))
        scaled = graph.call_function(operator.mul, (x, graph.get_attr(s_name)))
        y = graph.call_function(operator.add, (scaled, graph.get_attr(t_name)))
        if rank is None:
            y = graph.call_method("view_as", (y, match.source))
    return y


class DecomposeBatchNorm(FxPass):
    """Turn each inference BatchNorm still there after folding into ``x * s + t``.

    Leaves what the matcher refuses (training mode, no running stats, hooks, a subclass) and a BN
    whose input dtype differs from its statistics'.
    """

    optimization = MobileOptimizerType.DECOMPOSE_BATCHNORM
    summary: ClassVar[str] = "BatchNorm(x) (eval, not folded) -> x * s + t"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        buffers: BufferCache = {}
        for node in list(gm.graph.nodes):
            match = can_decompose(gm, node)
            if isinstance(match, str):
                skips.add(match)
                continue
            if match is None:
                continue
            constants = [a for a in node.all_input_nodes if a.op == "get_attr"]
            out = decompose(gm, match, buffers)
            if "tensor_meta" in node.meta:  # same shape and dtype: later BNs still know their rank
                out.meta["tensor_meta"] = node.meta["tensor_meta"]
            replace_node(node, out)
            for constant in constants:
                if not constant.users:
                    gm.graph.erase_node(constant)
            rewrites += 1
        if rewrites:
            erase_unused_attributes(gm)
        return PassResult(gm, rewrites, dict(skips))
