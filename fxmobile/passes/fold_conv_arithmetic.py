"""Fold constant add/sub/mul/div after a conv, transposed conv or linear layer into its weights.

    z = conv(x) + c   ->  z = conv'(x)   with  b' = b + c
    z = conv(x) - c   ->                       b' = b - c
    z = conv(x) * c   ->                       W' = W * c,  b' = b * c   (c per output channel)
    z = conv(x) / c   ->                       W' = W / c,  b' = b / c
    c + conv(x), c * conv(x)                   (commuted; ``alpha`` of torch.add/sub scales c,
                                                or scales conv(x) in ``torch.add(c, y, alpha=a)``)

Producers: ``nn.Conv1d/2d/3d``, ``nn.ConvTranspose1d/2d/3d``, ``nn.Linear`` (constant per last
dim) and ``F.conv*`` / ``F.conv_transpose*`` / ``F.linear`` whose weight and bias are ``get_attr``
tensors. Operations: ``operator.add/sub/mul/truediv``, ``torch.add/sub/mul/div`` (and their
aliases) and the methods of the same names. A chain (``conv -> *2 -> +1 -> /3``) is composed into
one affine map ``z = y * s + t`` in float64 and folded once, through ``affine_fold``, which keeps
the producer's dtype and handles the transposed-conv weight axis. A module called at several
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
import torch.nn.functional as F
from torch import fx

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.affine_fold import (
    PRODUCER_TYPES,
    fold_affine_into,
    out_channels,
    scale_output_channels,
)
from fxmobile.passes.graph_utils import (
    add_constant,
    attr_of,
    erase_unused_attributes,
    fresh_attr_name,
    module_of,
    tensor_meta,
)
from fxmobile.passes.stage import FxContext, FxPass


class Arith(enum.Enum):
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

# F.conv* / F.linear -> (dims after the channel axis, transposed)
_FUNCTIONAL_PRODUCERS: dict[Any, tuple[int, bool]] = {
    F.conv1d: (1, False),
    F.conv2d: (2, False),
    F.conv3d: (3, False),
    F.conv_transpose1d: (1, True),
    F.conv_transpose2d: (2, True),
    F.conv_transpose3d: (3, True),
    F.linear: (0, False),
}


@dataclass(frozen=True)
class Producer:
    """A layer whose output is ``W * x + b`` per output channel."""

    node: fx.Node
    label: str  # "conv" or "linear", for skip reasons
    channels: int
    trailing_dims: int  # dims after the channel axis: the spatial dims of a conv, 0 for linear
    max_rank: int | None  # a conv's output has at most trailing_dims + 2 dims; linear: any
    dtype: torch.dtype
    device: torch.device


@dataclass(frozen=True)
class Step:
    """One foldable operation ``z = y (op) c`` on the producer's output, ``c`` per channel."""

    node: fx.Node
    op: Arith
    commuted: bool
    vector: torch.Tensor  # c, float64, one entry per output channel
    alpha: float
    constant_node: fx.Node | None


def _arg(node: fx.Node, position: int, keyword: str, default: Any) -> Any:
    if len(node.args) > position:
        return node.args[position]
    return node.kwargs.get(keyword, default)


def _tensor_attr(gm: fx.GraphModule, value: Any) -> torch.Tensor | None:
    if isinstance(value, fx.Node) and value.op == "get_attr":
        attr = attr_of(gm, value)
        if isinstance(attr, torch.Tensor):
            return attr
    return None


def _producer(node: fx.Node, spatial: int, channels: int, weight: torch.Tensor) -> Producer:
    if spatial == 0:
        return Producer(node, "linear", channels, 0, None, weight.dtype, weight.device)
    return Producer(node, "conv", channels, spatial, spatial + 2, weight.dtype, weight.device)


def match_producer(gm: fx.GraphModule, node: fx.Node) -> Producer | str | None:
    """The producer ``node`` is, a reason it cannot take a fold, or None when it is no producer."""
    module = module_of(gm, node)
    if module is not None:
        if type(module) not in PRODUCER_TYPES:
            return None
        weight: torch.Tensor = module.weight  # type: ignore[assignment]
        spatial = weight.dim() - 2
        return _producer(node, spatial, out_channels(module), weight)
    if node.op != "call_function" or node.target not in _FUNCTIONAL_PRODUCERS:
        return None
    spatial, transposed = _FUNCTIONAL_PRODUCERS[node.target]
    label = "linear" if spatial == 0 else "conv"
    weight_ = _tensor_attr(gm, _arg(node, 1, "weight", None))
    bias = _arg(node, 2, "bias", None)
    if weight_ is None or (bias is not None and _tensor_attr(gm, bias) is None):
        return f"functional {label} weight or bias is not a get_attr tensor"
    groups = _arg(node, 6, "groups", 1) if spatial else 1
    if type(groups) is not int:
        return f"functional {label} groups is not a constant"
    channels = weight_.shape[1] * groups if transposed else weight_.shape[0]
    return _producer(node, spatial, int(channels), weight_)


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
        if size == 1 or (i == p.trailing_dims and size == p.channels):
            continue
        if i < p.trailing_dims:
            return "constant varies over spatial dims"
        if i > p.trailing_dims:
            return "constant varies over the batch dim"
        return f"constant has {size} channels, {p.label} has {p.channels}"
    if value.dim() > p.trailing_dims + 1:
        # Leading dims of 1 widen an output that has fewer dims (an unbatched conv's, say).
        if p.max_rank is not None and value.dim() > p.max_rank:
            return f"constant has more dims than the {p.label} output"
        if out_rank is None:
            return "shape unknown (pass example_inputs)"
        if value.dim() > out_rank:
            return f"constant has more dims than the {p.label} output"
    vector = value.detach().to(device=p.device, dtype=torch.float64).reshape(-1)
    return vector.expand(p.channels) if vector.numel() == 1 else vector


def can_fold(gm: fx.GraphModule, p: Producer, y: fx.Node) -> Step | str | None:
    """The fold of the one arithmetic user of ``y`` (``p``'s output so far), or why not.

    None when no user of ``y`` is an add/sub/mul/div with a constant: nothing to report.
    """
    users = list(y.users)
    if not users or not _has_constant_arith_user(y):
        return None
    if len(users) != 1:
        return f"{p.label} output has {len(users)} users"
    node = users[0]
    matched = _match_arith(node, y)
    assert matched is not None
    op, commuted, constant = matched
    if commuted and op is Arith.SUB:
        return f"constant minus {p.label} output (c - y) is not folded"
    if commuted and op is Arith.DIV:
        return f"constant divided by {p.label} output (c / y) is not affine"
    allowed = _KEYWORDS.get(op, frozenset())
    if set(node.kwargs) - allowed:
        return f"{op.value} has unsupported keyword arguments"
    if node.kwargs.get("rounding_mode") is not None:
        return "division with a rounding_mode"
    alpha: Any = node.kwargs.get("alpha", 1)
    if type(alpha) not in (int, float) or not math.isfinite(alpha):
        return "alpha is not a finite number"
    if not p.dtype.is_floating_point:
        return f"{p.label} output is not floating point"
    value = _tensor_attr(gm, constant) if isinstance(constant, fx.Node) else constant
    if value is None:
        return "constant get_attr is not a tensor"
    promoted = torch.result_type(torch.empty(1, dtype=p.dtype), value)
    if promoted != p.dtype:
        return f"constant would promote the {p.label} output from {p.dtype} to {promoted}"
    if isinstance(value, torch.Tensor):
        if value.device != p.device:
            return f"constant is on {value.device}, {p.label} on {p.device}"
        meta = tensor_meta(p.node)
        out_rank = len(meta.shape) if hasattr(meta, "shape") else None
        vector = _channel_vector(p, value, out_rank)
        if isinstance(vector, str):
            return vector
    else:
        vector = torch.full((p.channels,), value, dtype=torch.float64, device=p.device)
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


def _set_arg(node: fx.Node, position: int, keyword: str, value: fx.Node) -> None:
    if len(node.args) > position:
        args = list(node.args)
        args[position] = value
        node.args = tuple(args)
    else:
        node.kwargs = {**node.kwargs, keyword: value}


def _fold_functional(
    gm: fx.GraphModule, p: Producer, scale: torch.Tensor, shift: torch.Tensor
) -> None:
    node = p.node
    _, transposed = _FUNCTIONAL_PRODUCERS[node.target]
    weight_node = _arg(node, 1, "weight", None)
    bias_node = _arg(node, 2, "bias", None)
    weight = attr_of(gm, weight_node)
    groups = int(_arg(node, 6, "groups", 1)) if p.trailing_dims else 1
    new_w = scale_output_channels(weight, scale, transposed=transposed, groups=groups)
    bias = attr_of(gm, bias_node) if bias_node is not None else None
    b = bias.detach().to(torch.float64) if bias is not None else torch.zeros_like(scale)
    new_b = b * scale + shift
    w_name = add_constant(gm, f"{weight_node.target}_folded", new_w.to(weight.dtype))
    b_name = add_constant(gm, f"{weight_node.target}_bias_folded", new_b.to(weight.dtype))
    with gm.graph.inserting_before(node):
        w_attr = gm.graph.get_attr(w_name)
        b_attr = gm.graph.get_attr(b_name)
    _set_arg(node, 1, "weight", w_attr)
    _set_arg(node, 2, "bias", b_attr)
    for old in (weight_node, bias_node):
        if isinstance(old, fx.Node) and not old.users:
            gm.graph.erase_node(old)


def fold_steps(gm: fx.GraphModule, p: Producer, steps: list[Step]) -> None:
    """Fold ``steps`` (a chain on ``p``'s output) into ``p`` and remove them from the graph."""
    scale = torch.ones(p.channels, dtype=torch.float64, device=p.device)
    shift = torch.zeros(p.channels, dtype=torch.float64, device=p.device)
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
