"""Fold constant add/sub/mul/div after a conv, transposed conv or linear layer into its weights.

    z = conv(x) + c   ->  z = conv'(x)   with  b' = b + c
    z = conv(x) - c   ->                       b' = b - c
    z = conv(x) * c   ->                       W' = W * c,  b' = b * c   (c per output channel)
    z = conv(x) / c   ->                       W' = W / c,  b' = b / c
    c + conv(x), c * conv(x)                   (commuted; ``alpha`` of torch.add/sub scales c,
                                                or scales conv(x) in ``torch.add(c, y, alpha=a)``)

Producers (``nn.Conv*``, ``nn.ConvTranspose*``, ``nn.Linear``, with the constant per last dim,
and their functional forms with ``get_attr`` weights) are matched by ``fxmobile.passes.matchers``:
exact types, no hooks, no instance ``forward``. Operations: ``operator.add/sub/mul/truediv``,
``torch.add/sub/mul/div`` (and their aliases) and the methods of the same names. A chain
(``conv -> *2 -> +1 -> /3``) is composed into one affine map ``z = y * s + t`` in float64 and
folded once, through ``affine_fold``, which keeps the producer's dtype and handles the
transposed-conv weight axis. A module called at several
sites is never mutated: the folded site gets a new submodule.

The constant ``c`` is a Python number or a ``get_attr`` tensor that broadcasts per output channel:
all its dims are 1 except, optionally, the channel axis (``[C]`` for linear; ``[C, 1, 1]`` or
``[1, C, 1, 1]`` for a Conv2d). It is left alone, with a reason, when it would change the result:

- it varies over spatial dims or the batch dim, or has more dims than the output (the output
  would grow; a constant with as many dims as a batched output needs the output's rank, known
  only from shape propagation, since a conv also accepts unbatched input);
- it would change the output dtype (``torch.result_type``: a float64 tensor promotes a float32
  conv, a 0-dim tensor or a Python float does not);
- it divides by zero, or is not finite (``y * inf`` is not ``conv(x)`` with infinite weights);
- the conv output has other users, the operation is ``c - y`` or ``c / y`` (not folded), or
  ``torch.div`` has a ``rounding_mode``.
"""

from __future__ import annotations

import enum
import math
import operator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import fx

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.affine_fold import fold_affine_into, scale_output_channels
from fxmobile.passes.graph_utils import (
    add_constant,
    attr_of,
    erase_unused_attributes,
    fresh_attr_name,
    module_of,
    tensor_meta,
)
from fxmobile.passes.matchers import Producer, arg, constant_tensor, match_producer, set_arg
from fxmobile.passes.stage import FxContext, FxPass


class Arith(enum.Enum):
    """The operation a ``Step`` applies to the producer's output."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"


_FUNCTIONS: dict[Any, Arith] = {
    operator.add: Arith.ADD,
    torch.add: Arith.ADD,
    operator.sub: Arith.SUB,
    torch.sub: Arith.SUB,
    torch.subtract: Arith.SUB,
    operator.mul: Arith.MUL,
    torch.mul: Arith.MUL,
    torch.multiply: Arith.MUL,
    operator.truediv: Arith.DIV,
    torch.div: Arith.DIV,
    torch.divide: Arith.DIV,
    torch.true_divide: Arith.DIV,
}
_METHODS: dict[str, Arith] = {
    "add": Arith.ADD,
    "sub": Arith.SUB,
    "subtract": Arith.SUB,
    "mul": Arith.MUL,
    "multiply": Arith.MUL,
    "div": Arith.DIV,
    "divide": Arith.DIV,
    "true_divide": Arith.DIV,
}

# keyword arguments that may appear (alpha folds into c; rounding_mode=None is true division)
_KEYWORDS: dict[Arith, frozenset[str]] = {
    Arith.ADD: frozenset({"alpha"}),
    Arith.SUB: frozenset({"alpha"}),
    Arith.DIV: frozenset({"rounding_mode"}),
}


@dataclass(frozen=True)
class Step:
    """One foldable operation ``z = y (op) c`` on the producer's output, ``c`` per channel."""

    node: fx.Node
    op: Arith
    commuted: bool
    vector: torch.Tensor  # c, float64, one entry per output channel
    alpha: float
    constant_node: fx.Node | None


def _match_arith(node: fx.Node, operand: fx.Node) -> tuple[Arith, bool, Any] | None:
    """``(op, commuted, constant)`` when ``node`` is ``operand (op) constant`` or commuted."""
    if node.op == "call_function":
        op = _FUNCTIONS.get(node.target)
    elif node.op == "call_method":
        op = _METHODS.get(str(node.target))
    else:
        return None
    if op is None or len(node.args) != 2:
        return None
    a, b = node.args
    if a is operand and b is not operand:
        constant, commuted = b, False
    elif b is operand and a is not operand:
        constant, commuted = a, True
    else:
        return None
    is_number = isinstance(constant, int | float | complex)
    if not is_number and not (isinstance(constant, fx.Node) and constant.op == "get_attr"):
        return None  # a computed operand (a residual add, say): not a constant
    return op, commuted, constant


def _has_constant_arith_user(node: fx.Node) -> bool:
    return any(_match_arith(user, node) is not None for user in node.users)


def _channel_vector(p: Producer, value: torch.Tensor, out_rank: int | None) -> torch.Tensor | str:
    """``value`` as one float64 entry per output channel, or why it does not broadcast so."""
    for i, size in enumerate(reversed(value.shape)):
        if size == 1 or (i == p.spatial_dims and size == p.out_channels):
            continue
        if i < p.spatial_dims:
            return "constant varies over spatial dims"
        if i > p.spatial_dims:
            return "constant varies over the batch dim"
        return f"constant has {size} channels, {p.kind} has {p.out_channels}"
    if value.dim() > p.spatial_dims + 1:
        # Leading dims of 1 widen an output that has fewer dims (an unbatched conv's, say).
        if p.spatial_dims and value.dim() > p.spatial_dims + 2:
            return f"constant has more dims than the {p.kind} output"
        if out_rank is None:
            return "shape unknown (pass example_inputs)"
        if value.dim() > out_rank:
            return f"constant has more dims than the {p.kind} output"
    vector = value.detach().to(device=p.weight.device, dtype=torch.float64).reshape(-1)
    return vector.expand(p.out_channels) if vector.numel() == 1 else vector


def can_fold(gm: fx.GraphModule, p: Producer, y: fx.Node) -> Step | str | None:
    """The fold of the one arithmetic user of ``y`` (``p``'s output so far), or why not.

    None when no user of ``y`` is an add/sub/mul/div with a constant: nothing to report.
    """
    users = list(y.users)
    if not users or not _has_constant_arith_user(y):
        return None
    if len(users) != 1:
        return f"{p.kind} output has {len(users)} users"
    node = users[0]
    matched = _match_arith(node, y)
    assert matched is not None
    op, commuted, constant = matched
    if commuted and op is Arith.SUB:
        return f"constant minus {p.kind} output (c - y) is not folded"
    if commuted and op is Arith.DIV:
        return f"constant divided by {p.kind} output (c / y) is not affine"
    allowed = _KEYWORDS.get(op, frozenset())
    if set(node.kwargs) - allowed:
        return f"{op.value} has unsupported keyword arguments"
    if node.kwargs.get("rounding_mode") is not None:
        return "division with a rounding_mode"
    alpha: Any = node.kwargs.get("alpha", 1)
    if type(alpha) not in (int, float) or not math.isfinite(alpha):
        return "alpha is not a finite number"
    if not p.weight.dtype.is_floating_point:
        return f"{p.kind} output is not floating point"
    value = constant_tensor(gm, constant) if isinstance(constant, fx.Node) else constant
    if value is None or isinstance(value, str):
        return "constant get_attr is not a tensor"
    promoted = torch.result_type(torch.empty(1, dtype=p.weight.dtype), value)
    if promoted != p.weight.dtype:
        return f"constant would promote the {p.kind} output from {p.weight.dtype} to {promoted}"
    if isinstance(value, torch.Tensor):
        if value.device != p.weight.device:
            return f"constant is on {value.device}, {p.kind} on {p.weight.device}"
        meta = tensor_meta(p.node)
        out_rank = len(meta.shape) if hasattr(meta, "shape") else None
        vector = _channel_vector(p, value, out_rank)
        if isinstance(vector, str):
            return vector
    else:
        vector = torch.full((p.out_channels,), value, dtype=torch.float64, device=p.weight.device)
    if not bool(torch.isfinite(vector).all()):
        return "constant is not finite"
    if op is Arith.DIV and bool((vector == 0).any()):
        return "division by a constant with a zero"
    constant_node = constant if isinstance(constant, fx.Node) else None
    return Step(node, op, commuted, vector, float(alpha), constant_node)


def compose(
    scale: torch.Tensor, shift: torch.Tensor, step: Step
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, t)`` of ``step(y * scale + shift) = y * s + t``."""
    c, alpha = step.vector, step.alpha
    if step.op is Arith.ADD and step.commuted:
        return scale * alpha, shift * alpha + c  # c + alpha * y
    if step.op is Arith.ADD:
        return scale, shift + alpha * c  # y + alpha * c
    if step.op is Arith.SUB:
        return scale, shift - alpha * c  # y - alpha * c
    if step.op is Arith.MUL:
        return scale * c, shift * c  # y * c, c * y
    return scale / c, shift / c  # y / c


def _fold_functional(
    gm: fx.GraphModule, p: Producer, scale: torch.Tensor, shift: torch.Tensor
) -> None:
    node = p.node
    names = p.arg_names
    weight_node = arg(node, names, "weight")
    bias_node = arg(node, names, "bias")
    weight = attr_of(gm, weight_node)
    new_w = scale_output_channels(weight, scale, transposed=p.transposed, groups=p.groups)
    bias = attr_of(gm, bias_node) if bias_node is not None else None
    b = bias.detach().to(torch.float64) if bias is not None else torch.zeros_like(scale)
    new_b = b * scale + shift
    w_name = add_constant(gm, f"{weight_node.target}_folded", new_w)
    b_name = add_constant(gm, f"{weight_node.target}_bias_folded", new_b.to(weight.dtype))
    with gm.graph.inserting_before(node):
        w_attr = gm.graph.get_attr(w_name)
        b_attr = gm.graph.get_attr(b_name)
    set_arg(node, names, "weight", w_attr)
    set_arg(node, names, "bias", b_attr)
    for old in (weight_node, bias_node):
        if isinstance(old, fx.Node) and not old.users:
            gm.graph.erase_node(old)


def fold_steps(gm: fx.GraphModule, p: Producer, steps: list[Step]) -> None:
    """Fold ``steps`` (a chain on ``p``'s output) into ``p`` and remove them from the graph."""
    scale = torch.ones(p.out_channels, dtype=torch.float64, device=p.weight.device)
    shift = torch.zeros(p.out_channels, dtype=torch.float64, device=p.weight.device)
    for step in steps:
        scale, shift = compose(scale, shift, step)
    module = module_of(gm, p.node)
    if module is not None:
        # A new submodule for this site: the old one may be called elsewhere (pytorch#104593).
        name = fresh_attr_name(gm, f"{p.node.target}_folded")
        gm.add_submodule(name, fold_affine_into(module, scale, shift))
        p.node.target = name
    else:
        _fold_functional(gm, p, scale, shift)
    steps[-1].node.replace_all_uses_with(p.node)
    for step in reversed(steps):
        gm.graph.erase_node(step.node)
    for constant in {s.constant_node for s in steps if s.constant_node is not None}:
        if not constant.users:
            gm.graph.erase_node(constant)


class FoldConvArithmetic(FxPass):
    """Fold chains of constant add/sub/mul/div after a conv or linear layer into its weights.

    Leaves a constant that is not per output channel, would change the dtype, divides by zero or is
    not finite, and a producer output with other users.
    """

    optimization = MobileOptimizerType.FOLD_CONV_ARITHMETIC
    summary: ClassVar[str] = "conv(x) +-*/ per-channel constant -> conv'(x) with W', b' folded"
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            producer = match_producer(gm, node)
            if isinstance(producer, str):
                if _has_constant_arith_user(node):
                    skips.add(producer)
                continue
            if producer is None:
                continue
            steps: list[Step] = []
            y = node
            while True:
                step = can_fold(gm, producer, y)
                if isinstance(step, str):
                    skips.add(step)
                if not isinstance(step, Step):
                    break
                steps.append(step)
                y = step.node
            if steps:
                fold_steps(gm, producer, steps)
                rewrites += len(steps)
        if rewrites:
            erase_unused_attributes(gm)
        return PassResult(gm, rewrites, dict(skips))
