"""Scaled dot-product attention as batched matmuls and a softmax, masks as constants to add.

    o = scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale)
        q: [*B, L, E]   k: [*K, S, E]   v: [*K, S, Ev]

    ->  q3 = reshape(q * s, [b, g·L, E])       s = scale, or 1/sqrt(E); b = prod(K)
        k3 = permute(reshape(k, [b, S, E]), [0, 2, 1])
        a  = bmm(q3, k3)                        [b, g·L, S]
        a  = reshape(reshape(a, [*B, L, S]) + m, [b, g·L, S])   only with a mask
        o  = reshape(bmm(softmax(a, -1), reshape(v, [b, S, Ev])), [*B, L, Ev])

    K = B, g = 1                                each query head has its own keys
    K = (*B', 1, ..., 1), g = the 1s' B         multi-query attention: the keys broadcast over
                                                the last batch dims (MobileNetV4's hybrid blocks)
    K = (*B', Hk), B = (*B', g·Hk)              grouped-query attention (``enable_gqa``): query
                                                head h reads key head h // g

    m = attn_mask                                a float mask that is a constant, or that the
                                                 model computes from constants alone
      = where(attn_mask, 0, -inf)                a boolean constant one
      = where(tril(ones(L, S)), 0, -inf)         is_causal

ExecuTorch's own decomposition of attention scales ``q`` and ``k`` by ``sqrt(s)`` with
``mul.Scalar``, batches the matmuls with ``expand``, guards fully masked rows with ``eq``,
``logical_not``, ``any``, ``full_like`` and ``where``, and XNNPACK has a kernel for none of these:
each attention leaves six kinds of op on portable kernels between two delegate calls. Here the
scale is a constant of the query's dtype multiplied into ``q`` (L x E products, not L x S), and a
mask that is known before the model runs becomes one constant added to the scores.

Where the keys serve g query heads each, those heads' queries are rows of one matmul with them:
q's heads are its last batch dims, next to its rows, so the reshape keeps each head's rows
together, and query head h of a group is rows h·L to (h+1)·L. Eager broadcasts (or repeats) k
and v to every head instead.

A float mask the model computes in ``forward`` from its parameters alone (CoAtNet's
relative-position MLP, whose bias over 196 x 196 tokens the constant folding leaves to run time
as too large to store) is the same tensor on every call: it is evaluated once here, on the
module's tensors, and taken when every value is finite, so no query can attend to nothing. The
model still computes it at run time, as eager does, and the scores add it.

Left alone, with the reason: dropout (``dropout_p`` is not 0), batch dims of ``k`` and ``v``
that differ, or that ``q``'s do not extend as above (``q`` broadcast over ``k``'s, a key dim of
1 before a shared one), a dtype other than float32, a mask computed from the inputs, a boolean
mask computed at run time, one drawn at random, a run-time mask with an infinity or a NaN, and
a mask under which some query attends to nothing: eager's softmax is "safe" there (it returns
zeros), a softmax over ``-inf`` alone is NaN, and XNNPACK has no op that tells them apart at run
time. (Constant masks are what vision models have; fxmobile's constant folding makes one of a
mask built from constants in ``forward``.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import fx

from fxmobile.executorch.passes.aten import (
    aten,
    call,
    constant,
    dtype,
    input_independent,
    numel,
    rewrite_each,
    shape,
)
from fxmobile.executorch.passes.fold_constant_subgraphs import evaluate
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.graph_utils import attr_of
from fxmobile.passes.stage import FxContext, FxPass

_SIGNATURE = (
    "query",
    "key",
    "value",
    "attn_mask",
    "dropout_p",
    "is_causal",
    "scale",
    "enable_gqa",
)


@dataclass(frozen=True)
class Attention:
    """One ``scaled_dot_product_attention`` call, understood."""

    node: fx.Node
    q: fx.Node
    k: fx.Node
    v: fx.Node
    batch: tuple[int, ...]  # B, q's batch dims
    keys: int  # b, the batches of keys (and values)
    length: int  # L, queries
    group: int  # g, query heads per batch of keys
    source: int  # S, keys
    width: int  # E
    value_width: int  # Ev
    scale: float
    # added to the scores: a constant, or the node computing a mask from constants alone
    mask: torch.Tensor | fx.Node | None


class Constants:
    """The values of ``gm``'s input-independent nodes, evaluated once, on first use."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self._values: dict[fx.Node, Any] | None = None

    def value(self, node: fx.Node) -> Any:
        """``node``'s value, or None when it depends on the inputs or cannot be evaluated."""
        if self._values is None:
            self._values, _ = evaluate(self.gm, Skips())
        return self._values.get(node)


def _arguments(node: fx.Node) -> dict[str, Any]:
    bound = dict(zip(_SIGNATURE, node.args, strict=False))
    bound.update(node.kwargs)
    return bound


def can_decompose(
    gm: fx.GraphModule, node: fx.Node, constants: Constants | None = None
) -> Attention | str | None:
    """The attention ``node`` computes, a reason it must stay, or None when it is none.
    ``constants`` evaluates a mask computed from constants (shared by a pass's calls)."""
    if node.op != "call_function" or node.target is not aten.scaled_dot_product_attention.default:
        return None
    args = _arguments(node)
    q, k, v = args["query"], args["key"], args["value"]
    if float(args.get("dropout_p") or 0.0) != 0.0:
        return "dropout_p is not 0"
    shapes = [shape(x) for x in (q, k, v)]
    if any(s is None for s in shapes):
        return "input shape unknown (pass example_inputs)"
    qs, ks, vs = shapes
    assert qs is not None and ks is not None and vs is not None
    if any(dtype(x) is not torch.float32 for x in (q, k, v)):
        return "not float32: the XNNPACK delegate computes float32"
    if ks[:-2] != vs[:-2] or ks[-2] != vs[-2] or qs[-1] != ks[-1] or len(qs) != len(ks):
        return "k and v shapes differ, or q's from theirs"
    group = _group(qs[:-2], ks[:-2], bool(args.get("enable_gqa")))
    if isinstance(group, str):
        return group
    length, source = qs[-2], ks[-2]
    causal = bool(args.get("is_causal"))
    mask = _mask(gm, args.get("attn_mask"), causal, length, source, constants or Constants(gm))
    if isinstance(mask, str):
        return mask
    scale = args.get("scale")
    return Attention(
        node=node,
        q=q,
        k=k,
        v=v,
        batch=qs[:-2],
        keys=numel(ks[:-2]),
        length=length,
        group=group,
        source=source,
        width=qs[-1],
        value_width=vs[-1],
        scale=float(scale) if scale is not None else 1.0 / math.sqrt(qs[-1]),
        mask=mask,
    )


def _group(queries: tuple[int, ...], keys: tuple[int, ...], gqa: bool) -> int | str:
    """How many query heads each batch of keys serves, or why the batch dims are not taken:
    the keys' dims equal the queries', then 1s where the queries have heads (multi-query), or
    with ``enable_gqa`` a last dim that divides the queries' (grouped-query)."""
    if gqa:
        if not queries or queries[:-1] != keys[:-1] or queries[-1] % keys[-1]:
            return "grouped-query attention whose key heads do not divide the query heads"
        return queries[-1] // keys[-1]
    shared = 0
    while shared < len(keys) and keys[shared] == queries[shared]:
        shared += 1
    if any(k != 1 for k in keys[shared:]):
        return "q, k and v batch dims differ other than by k's heads of 1 (they broadcast)"
    return numel(queries[shared:])


def _mask(
    gm: fx.GraphModule, mask: Any, causal: bool, length: int, source: int, constants: Constants
) -> torch.Tensor | fx.Node | str | None:
    """The constant to add to the scores, the node of a mask computed from constants, None for
    no mask, or a reason to stay.

    Eager's attention returns zeros for a query whose every key is masked (its softmax is
    "safe"); a softmax over ``-inf`` alone is NaN, and XNNPACK has no op to tell the two apart
    at run time. So only a mask known before the model runs is taken, once it is seen to leave
    every query a key."""
    if causal:
        if mask is not None:
            return "both attn_mask and is_causal"  # torch refuses it too
        return _additive(torch.ones(length, source, dtype=torch.bool).tril())
    if mask is None:
        return None
    if not isinstance(mask, fx.Node):
        return f"attn_mask of type {type(mask).__name__}"
    if mask.op != "get_attr":
        return _computed_mask(mask, constants)
    value = attr_of(gm, mask)
    if value.dtype is torch.bool:
        value = _additive(value)
    elif value.dtype is not torch.float32:
        return f"{value.dtype} attn_mask"
    if bool(value.isneginf().all(-1).any()):
        return "a query attends to nothing under attn_mask"
    return value


def _computed_mask(mask: fx.Node, constants: Constants) -> fx.Node | str:
    """``mask``, a mask the model computes on every call, when it is computed from constants
    alone into finite float32 values; else why the attention stays."""
    if not input_independent(mask):
        return (
            "attn_mask computed from the inputs (it may mask a whole row, where eager gives zeros)"
        )
    value = constants.value(mask)
    if not isinstance(value, torch.Tensor):
        return "attn_mask drawn at random or not evaluable once"
    if value.dtype is not torch.float32:
        return f"{value.dtype} attn_mask computed at run time"
    if not bool(value.isfinite().all()):
        return "attn_mask computed at run time holds an infinity or a NaN"
    return mask


def _additive(keep: torch.Tensor) -> torch.Tensor:
    return torch.zeros(keep.shape, dtype=torch.float32).masked_fill(~keep, float("-inf"))


def decompose(gm: fx.GraphModule, match: Attention) -> fx.Node:
    """Insert the decomposition before ``match.node``; its output."""
    graph = gm.graph
    b, rows = match.keys, match.group * match.length
    length, source, width = match.length, match.source, match.width
    with graph.inserting_before(match.node):
        scale = constant(gm, "attention_scale", torch.tensor([match.scale], dtype=torch.float32))
        scaled = call(graph, aten.mul.Tensor, match.q, scale)
        q = call(graph, aten.reshape.default, scaled, [b, rows, width])
        k = call(graph, aten.reshape.default, match.k, [b, source, width])
        scores = call(graph, aten.bmm.default, q, call(graph, aten.permute.default, k, [0, 2, 1]))
        if match.mask is not None:
            mask = match.mask
            if isinstance(mask, torch.Tensor):
                mask = constant(gm, "attention_mask", mask)
            full = call(graph, aten.reshape.default, scores, [*match.batch, length, source])
            masked = call(graph, aten.add.Tensor, full, mask)
            scores = call(graph, aten.reshape.default, masked, [b, rows, source])
        weights = call(graph, aten._softmax.default, scores, -1, False)
        v = call(graph, aten.reshape.default, match.v, [b, source, match.value_width])
        out = call(graph, aten.bmm.default, weights, v)
        return call(graph, aten.reshape.default, out, [*match.batch, length, match.value_width])


class DecomposeSdpa(FxPass):
    """Write each float32 attention as ``bmm``, ``softmax`` and constants XNNPACK takes."""

    optimization = MobileOptimizerType.DECOMPOSE_SDPA
    summary: ClassVar[str] = "scaled_dot_product_attention -> bmm(softmax(bmm(q·s, kᵀ) + m), v)"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        constants = Constants(gm)
        return rewrite_each(gm, lambda node: can_decompose(gm, node, constants), decompose)
