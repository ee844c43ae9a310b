"""Remove operations that return their input unchanged.

    nn.Identity()(x)        -> x
    x + 0,  0 + x,  x - 0   -> x      # additive identity
    x * 1,  1 * x,  x / 1   -> x      # multiplicative identity

The arithmetic forms are removed only when the result provably has the input's dtype: the
scalar must be a Python int or float and the input's dtype known (from shape propagation) to be
one that the scalar does not promote. ``True + 0`` is ``int64``, and ``int_tensor + 0.0`` is
float, so without example inputs only ``nn.Identity`` goes. ``torch.div`` with a rounding mode
and ``add``/``sub`` with a keyword other than ``alpha`` are left alone, and so is an
arithmetic identity whose result is written in place or returned: ``x + 0`` is a fresh tensor,
and without it ``relu_`` would write to ``x`` (found by the differential fuzzer).
"""

from __future__ import annotations

import math
import operator
from typing import Any, ClassVar

import torch
from torch import fx, nn

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.graph_utils import (
    erase_unused_attributes,
    module_of,
    replace_node,
    tensor_meta,
    written_in_place,
)
from fxmobile.passes.matchers import why_customized
from fxmobile.passes.stage import FxContext, FxPass

# target -> (neutral element, whether the neutral element may come first)
_FUNCTIONS: dict[Any, tuple[int, bool]] = {
    operator.add: (0, True),
    torch.add: (0, True),
    operator.sub: (0, False),
    torch.sub: (0, False),
    operator.mul: (1, True),
    torch.mul: (1, True),
    operator.truediv: (1, False),
    torch.div: (1, False),
}
_METHODS: dict[str, tuple[int, bool]] = {
    "add": (0, False),
    "sub": (0, False),
    "mul": (1, False),
    "div": (1, False),
}


def _neutral_operand(node: fx.Node) -> fx.Node | str | None:
    """The tensor operand when ``node`` is ``x op neutral``; a skip reason when it is unsafe."""
    if node.op == "call_function" and node.target in _FUNCTIONS:
        neutral, commutes = _FUNCTIONS[node.target]
    elif node.op == "call_method" and node.target in _METHODS:
        neutral, commutes = _METHODS[str(node.target)]
    else:
        return None
    if set(node.kwargs) - {"alpha"} or len(node.args) != 2:
        return None
    a, b = node.args
    if isinstance(a, fx.Node) and _is_scalar(b, neutral):
        tensor, scalar = a, b
    elif commutes and isinstance(b, fx.Node) and _is_scalar(a, neutral):
        tensor, scalar = b, a
    else:
        return None
    alpha = node.kwargs.get("alpha", 1)
    if not isinstance(alpha, int | float) or not math.isfinite(alpha):
        return "alpha is not a finite number (x + inf * 0 is nan)"
    meta = tensor_meta(tensor)
    if meta is None:
        return "input dtype unknown (pass example_inputs)"
    if meta.dtype is torch.bool or (isinstance(scalar, float) and not meta.dtype.is_floating_point):
        return f"scalar would promote {meta.dtype}"
    if not meta.dtype.is_floating_point and node.target in (operator.truediv, torch.div, "div"):
        return "integer true division changes dtype"
    return tensor


def _copy_is_observable(gm: fx.GraphModule, node: fx.Node, source: fx.Node) -> bool:
    """Whether ``x + 0`` being a new tensor matters: something writes in place to it or to
    ``x`` (then the two would share the write), or it is returned (the caller would get its
    own tensor back)."""
    if any(user.op == "output" for user in node.users):
        return True
    return written_in_place(gm, node) or written_in_place(gm, source)


def _is_scalar(value: object, neutral: int) -> bool:
    return type(value) in (int, float) and value == neutral


class RemoveIdentity(FxPass):
    """Replace ``nn.Identity()(x)``, ``x + 0``, ``x - 0``, ``x * 1`` and ``x / 1`` with ``x``.

    Leaves the arithmetic forms unless the dtype provably stays, and when the result is written in
    place or returned (``x + 0`` is a copy).
    """

    optimization = MobileOptimizerType.REMOVE_IDENTITY
    summary: ClassVar[str] = "Identity(x), x+0, x-0, x*1, x/1 -> x"
    needs_shapes: ClassVar[bool] = True
    keeps_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            module = module_of(gm, node)
            if type(module) is nn.Identity:
                assert module is not None
                source = why_customized(module) or (node.args[0] if node.args else None)
            else:
                source = _neutral_operand(node)
                if isinstance(source, fx.Node) and _copy_is_observable(gm, node, source):
                    source = "x or the result is written in place, or returned (x + 0 is a copy)"
            if isinstance(source, str):
                skips.add(source)
                continue
            if not isinstance(source, fx.Node):
                continue
            replace_node(node, source)
            rewrites += 1
        if rewrites:
            erase_unused_attributes(gm)
        return PassResult(gm, rewrites, dict(skips))
