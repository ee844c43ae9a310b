"""Fuse a clamping activation into the prepacked op before it.

    ctx = prepack(W, b, ..., None, None);  y = run(x, ctx);  z = act(y)
      ->  ctx = prepack(W, b, ..., lo, hi);  z = run(x, ctx)

    relu / relu_            -> lo = 0,   hi = None
    relu6 / relu6_          -> lo = 0,   hi = 6          (upstream misses these)
    hardtanh / hardtanh_    -> lo = min, hi = max
    clamp / clamp_ (Scalar) -> lo = min, hi = max        (upstream misses these)
    clamp_min / clamp_max   -> one-sided                 (upstream misses these)

It gives up, and says why, when the bounds are not constants, when they cross (lo > hi) or meet
(lo == hi: XNNPACK's prepack ops refuse ``output_max == output_min``; a clamp that pins every
value is not worth a rule per backend), when the prepack op's bounds are already set (clamping
twice is not one clamp with the second's bounds: upstream's #35705), when the run's output
has another user besides the activation (it needs the unclamped values), or when one packed
context feeds several runs (clamping it would clamp the other runs too). Each backend says
which of its ops take a clamp.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.script.graph_utils import iter_nodes
from fxmobile.script.insert_prepacked_ops import Prepack
from fxmobile.script.stage import ScriptContext, ScriptPass

_NO_BOUND = object()


@dataclass(frozen=True)
class ClampSlots:
    """Where a prepack op takes its output bounds: argument positions of min and max."""

    prepack_kind: str
    min_index: int
    max_index: int


def clamp_slots(table: Sequence[Prepack]) -> dict[str, ClampSlots]:
    """The slots of a backend whose prepack ops take the bounds last, after the aten op's
    arguments (XNNPACK and Metal, as ``insert_prepacked_ops`` inserts them)."""
    return {e.run: ClampSlots(e.prepack, len(e.order), len(e.order) + 1) for e in table}


def _const(value: torch._C.Value) -> Any:
    """The constant a value holds, or ``_NO_BOUND`` when it is not a constant."""
    if value.node().kind() != "prim::Constant":
        return _NO_BOUND
    return value.toIValue()


def activation_bounds(node: torch._C.Node) -> tuple[Any, Any] | str | None:
    """(lo, hi) for a clamping activation; a skip reason; or None when ``node`` is none."""
    kind = node.kind()
    inputs = list(node.inputs())
    if kind in ("aten::relu", "aten::relu_"):
        return 0.0, None
    if kind in ("aten::relu6", "aten::relu6_"):
        return 0.0, 6.0
    if kind in ("aten::hardtanh", "aten::hardtanh_", "aten::clamp", "aten::clamp_"):
        lo, hi = _const(inputs[1]), _const(inputs[2])
    elif kind in ("aten::clamp_min", "aten::clamp_min_"):
        lo, hi = _const(inputs[1]), None
    elif kind in ("aten::clamp_max", "aten::clamp_max_"):
        lo, hi = None, _const(inputs[1])
    else:
        return None
    if lo is _NO_BOUND or hi is _NO_BOUND:
        return f"{kind} bounds are not constants"
    if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        return f"{kind} bounds are tensors"
    if lo is None and hi is None:
        return None
    if lo is not None and hi is not None and lo > hi:
        return f"{kind} bounds cross (min > max)"
    if lo is not None and hi is not None and lo == hi:
        return f"{kind} bounds meet (min == max)"
    return lo, hi


class FuseClamp(ScriptPass):
    """Fuses into the run ops ``slots`` names: run op kind -> where its prepack op takes the
    bounds (a backend's table)."""

    summary = "run(x, prepack(..)) -> relu/relu6/hardtanh/clamp -> run with bounds in prepack"

    def __init__(
        self, slots: Mapping[str, ClampSlots], optimization: MobileOptimizerType | None
    ) -> None:
        self.slots = dict(slots)
        self.optimization = optimization

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        """Fuse every clamping activation that follows a run op of the table."""
        fused, skips = 0, Skips()
        for method in ctx.methods:
            graph = module._c._get_method(method).graph
            # Collect first: fusing destroys activation nodes that a live walk would visit.
            runs = [n for n in iter_nodes(graph) if n.kind() in self.slots]
            for run in runs:
                # Again after a fusion: the next activation may now follow the run directly
                # (relu then hardtanh), and is refused with its reason.
                while (reason := self._fuse(graph, run, self.slots[run.kind()])) is None:
                    fused += 1
                if reason:
                    skips.add(reason)
        return PassResult(module, fused, dict(skips))

    @staticmethod
    def _fuse(graph: torch._C.Graph, run: torch._C.Node, slots: ClampSlots) -> str | None:
        """Fuse the activation after ``run``; a skip reason, "" when there is nothing to fuse."""
        uses = run.output().uses()
        if not uses:
            return ""
        activations = [u.user for u in uses if activation_bounds(u.user) is not None]
        if not activations:
            return ""
        act = activations[0]
        bounds = activation_bounds(act)
        if isinstance(bounds, str):
            return bounds
        assert bounds is not None
        if len(uses) > 1:
            return f"{run.kind()} output has {len(uses)} users"
        prepack = run.inputsAt(1).node()
        if prepack.kind() != slots.prepack_kind:
            return f"{run.kind()} context is not made by {slots.prepack_kind} in this graph"
        if len(prepack.output().uses()) > 1:
            return "packed context is shared by several runs"
        old_lo, old_hi = prepack.inputsAt(slots.min_index), prepack.inputsAt(slots.max_index)
        if _const(old_lo) is not None or _const(old_hi) is not None:
            return f"{slots.prepack_kind} bounds already set"
        lo, hi = bounds
        g: Any = graph  # torch's stubs omit Graph.insertConstant
        with graph.insert_point_guard(prepack):
            lo_value = g.insertConstant(float(lo)) if lo is not None else old_lo
            hi_value = g.insertConstant(float(hi)) if hi is not None else old_hi
        prepack.replaceInput(slots.min_index, lo_value)
        prepack.replaceInput(slots.max_index, hi_value)
        act.output().replaceAllUsesWith(run.output())
        act.destroy()
        return None
