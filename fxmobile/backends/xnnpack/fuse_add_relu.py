"""Add followed by ReLU as one kernel, for integer adds.

relu(add(a, b, alpha))    -> _add_relu(a, b, alpha)
relu_(add(a, b, alpha))   -> _add_relu(a, b, alpha)
relu_(add_(a, b, alpha))  -> _add_relu_(a, b, alpha)

``_add_relu`` computes ``min(max(a + alpha * b, 0), M)`` with ``M`` its first operand's dtype's
maximum. For integers that is ``relu(a + alpha * b)`` exactly (the sum wraps first, as ``add``
does, and nothing exceeds ``M``). For floats it is not: NaN becomes 0 and +inf becomes ``M``
(3.4e38 in float32), where ``relu`` keeps both, on every runtime that runs the file (ATen's
kernel; found by the fuzzer's NaN probe). Upstream ``optimize_for_mobile`` fuses float adds
anyway; fxmobile leaves a method with a float add alone and says so.

torch's rewrite also places the fused node without regard to aliasing, and ``_add_relu``
clamps with its first operand's dtype's bounds while it computes in the promoted dtype: a
method where that could change a result is left alone, with the reason (``why_not_fuse``;
aliasing is traced through views by ``fxmobile.script.aliasing``). An add fuses only when its
first operand is known to be of the add's result dtype, an integer one: from the graph's types
where it has them; else, in ``forward``, from the example inputs' dtypes carried through ops
that keep them (``static_dtypes``: a residual add of two conv outputs is two tensors of the
input's dtype); else from one run of ``forward`` on the example inputs that returns each
top-level add's operands (``probed_operands``). A frozen graph records no dtypes (freezing
erases even a traced graph's), so without example inputs its adds stay unfused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.script.aliasing import root, written_roots
from fxmobile.script.graph_utils import count_kinds, iter_nodes, method_graphs
from fxmobile.script.jit_passes import jit
from fxmobile.script.probe import probe
from fxmobile.script.stage import ScriptContext, ScriptPass

ALIASED = "method left alone: an add reads memory that another op writes in place"
READ_ELSEWHERE = "method left alone: an add_ writes a tensor that another op reads"
MIXED_DTYPES = "method left alone: an add's first operand is a constant or of another dtype"
UNKNOWN_DTYPES = "method left alone: an add's operand dtypes are unknown (pass example_inputs)"
FLOATING = "method left alone: _add_relu would turn a float add's NaN into 0 and inf into its max"
# What _add_relu has bounds for (any other first operand fails an INTERNAL ASSERT)
SUPPORTED = (torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64)
_FUSED = {"aten::_add_relu", "aten::_add_relu_"}
_ADDS = ("aten::add", "aten::add_")
_RELUS = ("aten::relu", "aten::relu_")
# Ops whose result has their first input's dtype whenever they run (each fails on the dtypes
# where it would not: a conv or linear on an input of another dtype than its weight, a pooling
# of integers). Not aten::view (its dtype overload reinterprets), nor aten::to and the like.
_KEEP_DTYPE = frozenset({
    "prepacked::conv2d_clamp_run", "prepacked::conv2d_transpose_clamp_run",
    "prepacked::linear_clamp_run", "aten::conv2d", "aten::conv_transpose2d", "aten::linear",
    "aten::relu", "aten::relu_", "aten::hardtanh", "aten::hardtanh_", "aten::hardswish",
    "aten::hardswish_", "aten::max_pool2d", "aten::avg_pool2d", "aten::adaptive_avg_pool2d",
    "aten::contiguous", "aten::clone", "aten::flatten", "aten::reshape", "aten::dropout",
})  # fmt: skip
# Elementwise ops whose result, for two tensors of one dtype, has that dtype.
_SAME_DTYPE_IN_OUT = frozenset({
    "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_",
    "aten::_add_relu", "aten::_add_relu_",
})  # fmt: skip


class FuseAddRelu(ScriptPass):
    """torch's add + relu fusion, run only on methods where ``_add_relu`` computes the same:
    methods whose adds that a relu reads are all integer adds."""

    optimization = MobileOptimizerType.FUSE_ADD_RELU
    summary = "integer add (+ relu / relu_) -> aten::_add_relu"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        before = count_kinds(module, ctx.methods, _FUSED)
        skips: dict[str, int] = {}
        inputs = ctx.example_inputs
        for name, graph in zip(ctx.methods, method_graphs(module, ctx.methods), strict=True):
            known = static_dtypes(graph, inputs) if name == "forward" and inputs else {}
            reason = why_not_fuse(graph, {}, known)
            if reason == UNKNOWN_DTYPES and name == "forward" and inputs is not None:
                reason = why_not_fuse(graph, probed_operands(module, inputs), known)
            if reason:
                skips[reason] = skips.get(reason, 0) + 1
            else:
                jit._jit_pass_fuse_add_relu(graph)
        fused = count_kinds(module, ctx.methods, _FUSED) - before
        return PassResult(module, fused, skips)


def why_not_fuse(
    graph: torch._C.Graph,
    probed: Mapping[torch._C.Value, Any],
    known: Mapping[torch._C.Value, torch.dtype] | None = None,
) -> str | None:
    """Why torch's rewrite may not run on ``graph``, or None when every add in it is safe;
    ``probed`` holds operand values seen in a run (``probed_operands``), ``known`` dtypes the
    graph's types do not give (``static_dtypes``).

    The rewrite places the fused node right after its last input is defined, which can be
    before other ops that write or read the add's operands (it moved ``_add_relu_(x, c)``
    above a ``relu(x)`` that had read ``x`` before the ``add_``: found by the fuzzer). And
    ``_add_relu`` clamps in its first operand's dtype: a float64 0-dim first operand of a
    float32 add fails with "value cannot be converted to type float without overflow", an
    integer one would clamp at its maximum, a bool one fails an INTERNAL ASSERT.
    """
    nodes = list(iter_nodes(graph))
    adds = [n for n in nodes if n.kind() in _ADDS]
    if not adds:
        return None
    written = written_roots(graph)

    known = known or {}
    verdicts = {n: _dtype_verdict(n, probed, known) for n in adds if _fusable(n)}

    def mixed(node: torch._C.Node) -> bool:
        constant = node.inputsAt(0).node().kind() == "prim::Constant"
        return constant or verdicts.get(node) == MIXED_DTYPES

    def unknown(node: torch._C.Node) -> bool:
        return verdicts.get(node) == UNKNOWN_DTYPES

    def floating(node: torch._C.Node) -> bool:
        return verdicts.get(node) == FLOATING

    def own_write(node: torch._C.Node) -> torch._C.Value | None:
        """add_ writes its own first input: that write is the pattern's, not another op's."""
        return root(node.inputsAt(0)) if node.kind() == "aten::add_" else None

    def aliased(node: torch._C.Node) -> bool:
        others = written - {own_write(node)}
        return any(root(v) in others for v in list(node.inputs())[:2])

    readers: dict[torch._C.Value, list[torch._C.Node]] = {}  # root -> nodes reading it
    for other in nodes:
        for v in other.inputs():
            readers.setdefault(root(v), []).append(other)

    def read_elsewhere(node: torch._C.Node) -> bool:
        own = own_write(node)
        return own is not None and any(other is not node for other in readers.get(own, []))

    for check, reason in (
        (mixed, MIXED_DTYPES),
        (unknown, UNKNOWN_DTYPES),
        (aliased, ALIASED),
        (read_elsewhere, READ_ELSEWHERE),
        (floating, FLOATING),
    ):
        if any(check(node) for node in adds):
            return reason
    return None


def _fusable(node: torch._C.Node) -> bool:
    """An add whose result a relu reads: what torch's rewrite may fuse."""
    return node.kind() in _ADDS and any(u.user.kind() in _RELUS for u in node.output().uses())


def _dtype_verdict(
    node: torch._C.Node,
    probed: Mapping[torch._C.Value, Any],
    known: Mapping[torch._C.Value, torch.dtype],
) -> str | None:
    """None when the add's first operand is of its result dtype and an integer one;
    ``UNKNOWN_DTYPES`` when that is unknown, ``MIXED_DTYPES`` when the first operand is of
    another dtype or one ``_add_relu`` has no bounds for, ``FLOATING`` when it is a float."""
    a, b = node.inputsAt(0), node.inputsAt(1)
    if a in probed and b in probed:
        first, other = probed[a], probed[b]
    else:
        # from the graph's types, which give no dims: a tensor's dtype promotes according to
        # them (float64 0-dim + float32 1-D is float32), so only an equal one is trusted
        first, other = _sample(a, known), _sample(b, known)
        if first is None or other is None:
            return UNKNOWN_DTYPES
        if isinstance(other, torch.Tensor) and getattr(first, "dtype", None) != other.dtype:
            return MIXED_DTYPES
    if not isinstance(first, torch.Tensor) or first.dtype not in SUPPORTED:
        return MIXED_DTYPES
    if torch.result_type(first, other) != first.dtype:
        return MIXED_DTYPES
    return FLOATING if first.dtype.is_floating_point else None


def _sample(
    value: torch._C.Value, known: Mapping[torch._C.Value, torch.dtype]
) -> torch.Tensor | bool | int | float | None:
    """A value of the dtype or number kind the graph (or ``known``) gives ``value``, or None
    when neither says."""
    kind = value.type()
    if isinstance(kind, torch._C.TensorType):
        dtype = kind.dtype() or known.get(value)
        return None if dtype is None else torch.empty(1, dtype=dtype)
    numbers: dict[Any, bool | int | float] = {
        torch._C.BoolType: True, torch._C.IntType: 1, torch._C.FloatType: 1.0
    }  # fmt: skip
    return numbers.get(type(kind))


def static_dtypes(
    graph: torch._C.Graph, inputs: Sequence[Any]
) -> dict[torch._C.Value, torch.dtype]:
    """The dtype of each tensor of ``graph`` that follows from the example ``inputs`` (tensors,
    in the order of the graph's inputs after ``self``) and the constants, through
    ``_KEEP_DTYPE`` ops and ``_SAME_DTYPE_IN_OUT`` ops on two tensors of one dtype. Blocks are
    visited after the block around them (``iter_nodes``), so every value is seen after its
    definition; a block's own inputs and outputs (loop-carried values, an ``if``'s result) stay
    unknown."""
    dtypes: dict[torch._C.Value, torch.dtype] = {}
    for value, given in zip(list(graph.inputs())[1:], inputs, strict=False):  # defaults after
        if isinstance(given, torch.Tensor):
            dtypes[value] = given.dtype
    for node in iter_nodes(graph):
        if node.outputsSize() != 1 or not isinstance(node.output().type(), torch._C.TensorType):
            continue
        kind, ins = node.kind(), list(node.inputs())
        dtype: torch.dtype | None = None
        if kind == "prim::Constant":
            constant = node.output().toIValue()
            dtype = constant.dtype if isinstance(constant, torch.Tensor) else None
        elif kind in _KEEP_DTYPE and ins:
            dtype = dtypes.get(ins[0])
        elif kind in _SAME_DTYPE_IN_OUT and len(ins) >= 2:
            first, second = dtypes.get(ins[0]), dtypes.get(ins[1])
            dtype = first if first is not None and first == second else None
        if dtype is not None:
            dtypes[node.output()] = dtype
    return dtypes


def probed_operands(
    module: torch.jit.ScriptModule, inputs: Sequence[Any]
) -> dict[torch._C.Value, Any]:
    """The operands of each top-level add in ``forward``, from one run on ``inputs``
    (``fxmobile.script.probe``); empty when the run fails."""
    graph = module._c._get_method("forward").graph
    operands = [v for node in graph.nodes() if _fusable(node) for v in list(node.inputs())[:2]]
    found = probe(module, graph, operands, inputs)
    return {value: seen[0] for value, seen in (found or {}).items()}
