"""An inference BatchNorm that XNNPACK would not fuse into a conv, as a multiply-add.

    y = batch_norm(x, mean, var, gamma, beta, eps)     (eval: the running statistics)

    ->  y = x * s + t       s = gamma / sqrt(var + eps),  t = beta - mean * s
                            computed in float64, stored in the statistics' dtype, shaped
                            [C, 1, ..., 1] to broadcast over dim 1 of x

The algebra, and ``s`` and ``t`` themselves, are the FX stage's ``decompose_batchnorm``
(``matchers.BatchNormCall.scale_shift``); this pass finds the BatchNorm in the exported graph,
where it is ``aten._native_batch_norm_legit_no_training`` (or ``batch_norm`` /
``native_batch_norm`` with ``training`` False), for models ``torch.fx`` could not capture: then
``torch.export`` takes the eager model whole and no FX pass ran.

XNNPACK fuses a BatchNorm into the conv or linear it follows (``FuseBatchNormPass``: the
producer's only user, static weights on both, a 1-D or 2-D conv), and that is left to it, with
the reason. Any other BatchNorm it takes as a 1x1 depthwise convolution, exact on finite inputs
but not at infinities: an Inf in the input made NaN of its neighbours in the same channel
(research note, R7), where eager's ``x * s + t`` keeps an Inf an Inf. ``x * s + t`` is two
elementwise ops XNNPACK takes, and keeps eager's NaN and infinities.

Left alone, with the reason: a BatchNorm XNNPACK fuses, one in training mode, statistics or
affine parameters that are not constants, an input whose dtype differs from the statistics'
(``batch_norm`` computes a float16 input in float32 and returns float16) or whose shape is
unknown, and a BatchNorm whose saved statistics are read.
"""

from __future__ import annotations

import operator
from typing import Any, ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import aten, call, constant, dtype, replace_with, shape
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.graph_utils import attr_of, erase_unused_attributes
from fxmobile.passes.matchers import BatchNormCall
from fxmobile.passes.stage import FxContext, FxPass

# BatchNorm op -> (index of ``training`` in its arguments or None: never training, index of
# eps, whether it returns (output, saved mean, saved rstd)); every one starts with
# (input, weight, bias, running_mean, running_var).
BATCH_NORMS: dict[Any, tuple[int | None, int, bool]] = {
    aten._native_batch_norm_legit_no_training.default: (None, 6, True),
    aten.native_batch_norm.default: (5, 7, True),
    aten.batch_norm.default: (5, 7, False),
}
# What XNNPACK's FuseBatchNormPass fuses a BatchNorm into (all are its edge ``convolution``
# or ``linear``); a transposed convolution is not taken as one.
FUSING = frozenset({aten.conv1d.default, aten.conv2d.default, aten.linear.default})


def can_decompose(gm: fx.GraphModule, node: fx.Node) -> BatchNormCall | str | None:
    """The BatchNorm ``node`` computes, a reason it must stay, or None when it is none."""
    if node.op != "call_function" or node.target not in BATCH_NORMS:
        return None
    training_at, eps_at, returns_tuple = BATCH_NORMS[node.target]
    if training_at is not None and node.args[training_at] is not False:
        return "BN in training mode"
    source = node.args[0]
    assert isinstance(source, fx.Node)
    fused = fused_by_xnnpack(source, node)
    if fused:
        return fused
    if returns_tuple and any(
        u.target is not operator.getitem or u.args[1] != 0 for u in node.users
    ):
        return "its saved statistics are read"
    stats = [_constant(gm, a) for a in node.args[1:5]]
    tensors = [s for s in stats if not isinstance(s, str)]
    if len(tensors) < len(stats):
        return "BN stats or affine params are not constants"
    gamma, beta, mean, var = tensors
    if mean is None or var is None:
        return "BN has no running stats"
    sizes = shape(source)
    if sizes is None or len(sizes) < 2:
        return "input shape unknown (pass example_inputs)"
    if dtype(source) != mean.dtype:
        return f"BN input dtype {dtype(source)} differs from its statistics' {mean.dtype}"
    eps = float(node.args[eps_at])  # type: ignore[arg-type]
    ranks = frozenset({len(sizes)})
    return BatchNormCall(node, source, mean, var, gamma, beta, eps, ranks, "batch_norm")


def fused_by_xnnpack(source: fx.Node, node: fx.Node) -> str | None:
    """The reason ``node`` is left to XNNPACK's fusion into ``source``, or None when XNNPACK
    would not fuse it (``FuseBatchNormPass.can_fuse``'s conditions, on the ATen graph)."""
    if source.op != "call_function" or source.target not in FUSING or len(source.users) != 1:
        return None
    weights = (source.args[1], node.args[1])
    if not all(isinstance(w, fx.Node) and w.op == "get_attr" for w in weights):
        return None
    return "follows a conv or linear: XNNPACK fuses it into its weights"


def _constant(gm: fx.GraphModule, value: Any) -> torch.Tensor | str | None:
    if value is None:
        return None
    if isinstance(value, fx.Node) and value.op == "get_attr":
        found = attr_of(gm, value)
        if isinstance(found, torch.Tensor):
            return found
    return "computed"


def decompose(gm: fx.GraphModule, match: BatchNormCall) -> fx.Node:
    """``x * s + t``, inserted before the BatchNorm; its output."""
    s, t = match.scale_shift()
    rank = match.rank
    assert rank is not None
    sizes = (-1, *[1] * (rank - 2))
    graph = gm.graph
    with graph.inserting_before(match.node):
        scale = constant(gm, "batch_norm_scale", s.reshape(sizes).to(match.mean.dtype))
        shift = constant(gm, "batch_norm_shift", t.reshape(sizes).to(match.mean.dtype))
        return call(
            graph, aten.add.Tensor, call(graph, aten.mul.Tensor, match.source, scale), shift
        )


class DecomposeBatchNorm(FxPass):
    """Turn each inference BatchNorm XNNPACK would not fuse into ``x * s + t``."""

    optimization = MobileOptimizerType.DECOMPOSE_BATCHNORM
    summary: ClassVar[str] = "batch_norm(x) (eval, not after a conv) -> x * s + t"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            match = can_decompose(gm, node)
            if isinstance(match, str):
                skips.add(match)
                continue
            if match is None:
                continue
            constants = [a for a in node.all_input_nodes if a.op == "get_attr"]
            out = decompose(gm, match)
            if BATCH_NORMS[node.target][2]:  # the output is the tuple's first element
                for user in list(node.users):
                    replace_with(user, out)
                gm.graph.erase_node(node)
            else:
                replace_with(node, out)
            for attribute in constants:
                if not attribute.users:
                    gm.graph.erase_node(attribute)
            rewrites += 1
        if rewrites:
            erase_unused_attributes(gm)
        return PassResult(gm, rewrites, dict(skips))
