"""Fold an inference-mode BatchNorm into the conv, transposed conv or linear layer before it.

    y = BatchNorm(producer(x))           ->  y = producer'(x)
    y = F.batch_norm(F.conv2d(x, W, b), mean, var, gamma, beta, training=False, eps=eps)
                                         ->  y = F.conv2d(x, W', b')

with, per output channel ``o`` (``gamma = 1``, ``beta = 0`` when the BN has no affine params):

    s[o] = gamma[o] / sqrt(var[o] + eps)
    t[o] = beta[o] - mean[o] * s[o]
    W'[o] = W[o] * s[o]
    b'[o] = b[o] * s[o] + t[o]          (b = 0 when the producer had no bias: it gains one)

Producers and BatchNorms are matched by ``fxmobile.passes.matchers`` (module and functional
forms; exact types, no hooks). The per-channel arithmetic is ``affine_fold`` (float64, written
back in the producer's dtype, transposed-conv weight axis per group). A folded module replaces
the producer at its path only when nothing else can reach that path; otherwise it is installed
as a new ``<path>_bn_folded`` submodule and the shared module is left as it was
(pytorch/pytorch#104593).

The pass gives up, with a reason in the result, when:
- the BN is in training mode, or has no running stats (it then normalizes with batch stats even
  in eval, pytorch/pytorch#71259), or its stats, affine params, eps or training flag are not
  constants;
- the producer output has other users that read its values (they would see the folded
  values; one that asks only its shape, rank, dtype or device, as timm's ``BatchNormAct2d``
  asserts ``x.ndim == 4``, gets the same answer from the folded output);
- the BN's feature count differs from the producer's output channels (pytorch/pytorch#118990);
- the axis BN normalizes (dim 1) is not provably the producer's channel axis. A conv's channels
  are dim 1 only for a batched input (an unbatched ``Conv1d`` gives ``[C, L]``, where a
  BatchNorm1d normalizes ``L``), a Linear's features are the last dim, so dim 1 only for a 2-D
  output. The rank comes from the example inputs' shapes when given, else from what the graph
  proves: the BN's own input-rank check (BatchNorm2d takes only 4-D), and ``flatten(x, 1)`` /
  ``view(n, -1)`` / ``Linear`` before a Linear. Otherwise: "shape unknown (pass example_inputs)";
- a module involved has forward hooks or a forward of its own, or is a subclass (see
  ``matchers``: hooks would see or skip the folded values).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.affine_fold import fold_affine_into, scale_output_channels
from fxmobile.passes.graph_utils import (
    add_constant,
    attr_of,
    erase_unused_attributes,
    fresh_attr_name,
    module_of,
    replace_node,
    tensor_meta,
    value_users,
)
from fxmobile.passes.matchers import (
    BatchNormCall,
    Producer,
    arg,
    match_batchnorm,
    match_producer,
    set_arg,
)
from fxmobile.passes.stage import FxContext, FxPass


@dataclass(frozen=True)
class Match:
    """A foldable BatchNorm and the conv, transposed conv or linear layer it folds into."""

    bn: BatchNormCall
    producer: Producer


def _proven_rank(gm: fx.GraphModule, node: fx.Node) -> int | None:
    """The rank of ``node``'s output from shape propagation, or from what the graph proves."""
    meta = tensor_meta(node)
    if meta is not None and hasattr(meta, "shape"):
        return len(meta.shape)
    module = module_of(gm, node)
    names = ("input", "start_dim", "end_dim")
    if type(module) is nn.Flatten:
        start, end = module.start_dim, module.end_dim
    elif node.target is torch.flatten or (node.op == "call_method" and node.target == "flatten"):
        start, end = arg(node, names, "start_dim", 0), arg(node, names, "end_dim", -1)
    elif type(module) is nn.Linear or (node.op == "call_function" and node.target is F.linear):
        source = node.args[0] if node.args else node.kwargs.get("input")
        return _proven_rank(gm, source) if isinstance(source, fx.Node) else None
    elif (node.op == "call_method" and node.target in ("view", "reshape")) or (
        node.target is torch.reshape and len(node.args) == 2
    ):
        return _size_rank(node.args[1:])
    else:
        return None
    # flatten(x, start) -> rank start + 1 (it raises on an input of lower rank)
    return start + 1 if type(start) is int and start >= 0 and end == -1 else None


def _size_rank(sizes: Sequence[Any]) -> int | None:
    """The rank of ``view(*sizes)``; None when a size may be a whole shape (or a dtype)."""
    if len(sizes) == 1 and isinstance(sizes[0], tuple | list):
        sizes = sizes[0]
    elif len(sizes) == 1 and type(sizes[0]) is not int:
        return None
    return len(sizes) if all(type(s) is int or isinstance(s, fx.Node) for s in sizes) else None


def _axis_reason(gm: fx.GraphModule, bn: BatchNormCall, producer: Producer) -> str | None:
    """None when BN's dim 1 is provably the producer's channel axis, else why not."""
    good = producer.channel_rank
    rank = _proven_rank(gm, producer.node)
    if rank is None:
        ranks = [r for r in (bn.ranks, producer.ranks) if r is not None]
        possible = frozenset.intersection(*ranks) if ranks else None
        if possible == {good}:
            return None
        if possible is None or good in possible:
            return "shape unknown (pass example_inputs)"
        rank_text = "/".join(str(r) for r in sorted(possible)) or "?"
    elif rank == good:
        return None
    else:
        rank_text = str(rank)
    return f"{producer.label} output is {rank_text}-D: BN normalizes dim 1, not its channels"


def can_fold(gm: fx.GraphModule, node: fx.Node) -> Match | str | None:
    """The BN at ``node`` and the producer it folds into, a skip reason, or None if no BN."""
    bn = match_batchnorm(gm, node)
    if bn is None or isinstance(bn, str):
        return bn
    producer = match_producer(gm, bn.source)
    if producer is None:
        return "BN input is not a conv, transposed conv or linear"
    if isinstance(producer, str):
        return producer
    readers = value_users(producer.node)
    if len(readers) != 1:
        return f"producer output has {len(readers)} users"
    n = producer.out_channels
    if any(t is not None and t.shape != (n,) for t in (bn.mean, bn.var, bn.gamma, bn.beta)):
        return f"BN has {bn.mean.numel()} features, producer has {n} output channels"
    axis_reason = _axis_reason(gm, bn, producer)
    return axis_reason if axis_reason is not None else Match(bn, producer)


def _reachable_elsewhere(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether replacing the module at ``node.target`` could change anything but ``node``."""
    path = str(node.target)
    for other in gm.graph.nodes:
        if other is node or other.op not in ("call_module", "get_attr"):
            continue
        target = str(other.target)
        # the same module, one of its tensors, or a leaf module that contains it
        if target == path or target.startswith(path + ".") or path.startswith(target + "."):
            return True
    module = gm.get_submodule(path)
    # another path to the same object (e.g. through an aliased parent) would see the change
    return any(m is module and name != path for name, m in gm.named_modules(remove_duplicate=False))


def _fold_into_module(
    gm: fx.GraphModule, producer: Producer, scale: torch.Tensor, shift: torch.Tensor
) -> None:
    assert producer.module is not None
    folded = fold_affine_into(producer.module, scale, shift)
    node = producer.node
    if _reachable_elsewhere(gm, node):
        # the shared module stays as it is for its other users (pytorch/pytorch#104593)
        node.target = fresh_attr_name(gm, f"{node.target}_bn_folded")
    gm.add_submodule(str(node.target), folded)


def _fold_into_function(
    gm: fx.GraphModule, producer: Producer, scale: torch.Tensor, shift: torch.Tensor
) -> None:
    node, names = producer.node, producer.arg_names
    weight_node = arg(node, names, "weight")
    bias_node = arg(node, names, "bias")
    weight = attr_of(gm, weight_node)
    bias = torch.zeros_like(scale) if bias_node is None else attr_of(gm, bias_node).double()
    groups, transposed = producer.groups, producer.transposed
    new_w = scale_output_channels(weight, scale, transposed=transposed, groups=groups)
    new_b = bias * scale + shift  # b' = b * s + t
    base = f"{weight_node.target}_bn_folded"
    with gm.graph.inserting_before(node):
        w_attr = gm.graph.get_attr(add_constant(gm, base, new_w))
        b_attr = gm.graph.get_attr(add_constant(gm, f"{base}_bias", new_b.to(weight.dtype)))
    set_arg(node, names, "weight", w_attr)
    set_arg(node, names, "bias", b_attr)
    _erase_unused_constants(gm, (weight_node, bias_node))


def _erase_unused_constants(gm: fx.GraphModule, nodes: Sequence[Any]) -> None:
    for n in nodes:
        if isinstance(n, fx.Node) and n.op == "get_attr" and not n.users:
            gm.graph.erase_node(n)


def fold(gm: fx.GraphModule, match: Match) -> None:
    """Fold ``match.bn`` into ``match.producer`` and remove the BN node."""
    scale, shift = match.bn.scale_shift()
    if match.producer.module is not None:
        _fold_into_module(gm, match.producer, scale, shift)
    else:
        _fold_into_function(gm, match.producer, scale, shift)
    bn_inputs = list(match.bn.node.all_input_nodes)
    replace_node(match.bn.node, match.producer.node)
    _erase_unused_constants(gm, bn_inputs)


class FoldBatchNorm(FxPass):
    """Fold each inference BatchNorm into the conv, transposed conv or linear layer before it.

    Leaves a BN whose producer output has other users, whose features or normalized axis are not
    provably the producer's output channels, or that the matcher refuses (training, hooks).
    """

    optimization = MobileOptimizerType.CONV_BN_FUSION
    summary: ClassVar[str] = "BatchNorm(conv/conv_transpose/linear(x)) -> conv'/linear'(x)"
    needs_shapes: ClassVar[bool] = True
    keeps_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            match = can_fold(gm, node)
            if match is None:
                continue
            if isinstance(match, str):
                skips.add(match)
                continue
            with torch.no_grad():
                fold(gm, match)
            rewrites += 1
        if rewrites:
            erase_unused_attributes(gm)
        return PassResult(gm, rewrites, dict(skips))
