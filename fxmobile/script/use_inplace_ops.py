"""Elementwise ops write into a tensor nothing else reads, instead of allocating a new one.

    y = hardsigmoid(s)        ->  y = hardsigmoid_(s)     (also relu, sigmoid, hardswish, ...)
    z = add(a, b, alpha)      ->  z = add_(a, b, alpha)   (also sub, mul, div, _add_relu)
    z = mul(s, x)             ->  z = mul_(x, s)          (a * b == b * a in IEEE arithmetic;
                                                           add too, when alpha is 1)

A prepacked convolution's output comes from the mobile allocator (XNNPACK's, with the tail
padding its kernels read past the end); a tensor an elementwise op allocates does not, so
upstream's ``prepacked::conv2d_clamp_run`` copies it before it convolves (2.12.1: one
``aten::copy_`` per convolution that reads an ``add`` or a squeeze-excitation ``mul``). Written
in place, the result stays in the convolution's buffer and the copy and the allocation go. So
a binary op is rewritten only when a prepacked op reads its result, directly or through
activations (resnet's ``conv(relu(conv(x) + x))``: ``add_`` into the first convolution's
output, then ``relu_``); an activation, wherever its input may be written (one allocation
less).

A tensor is written only when nothing can tell: an op of the same block made it fresh (no
view, input, constant or attribute; in-place ops after that are followed back, as in
``hardswish_(conv(x))``), and every other reader of it, under any name (an in-place op's
result, a list or tuple holding it), runs before and returns no view of it (so it is not
returned, and a write inside a loop body cannot reach the next iteration).
The result must have the written tensor's shape and
dtype: unary ops keep both on floating tensors (a prepacked op's output, or the example
inputs show it floating); a binary op is rewritten only in ``forward`` with example inputs,
where they show the written operand already has the result's shape and dtype (an in-place op
cannot broadcast its first operand): through the ops' own rules (``static_shapes``: convs,
pooling, broadcasting...), or from one run when an op this pass could rewrite reads a tensor
those rules do not reach. With other input shapes that would make the written operand
broadcast, the in-place op raises where the original returned; it never returns other numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from fxmobile import ops
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.script.graph_utils import method_graphs
from fxmobile.script.probe import probe
from fxmobile.script.stage import ScriptContext, ScriptPass
from fxmobile.script.static_shapes import scalar_type_number, static_shapes

# Activations that stay out of the prepacked ops: those with no clamp form, and the relus and
# hardtanhs fuse_clamp (which runs first) could not fuse, such as a relu after a residual add.
UNARY = frozenset(
    f"aten::{n}"
    for n in ("relu", "hardtanh", "hardsigmoid", "sigmoid", "hardswish", "silu", "tanh", "gelu")
)  # fmt: skip
BINARY = frozenset({"aten::add", "aten::sub", "aten::mul", "aten::div", "aten::_add_relu"})
COMMUTATIVE = frozenset({"aten::add", "aten::mul", "aten::_add_relu"})
PACKED_RUNS = frozenset(
    {"prepacked::conv2d_clamp_run", "prepacked::conv2d_transpose_clamp_run",
     "prepacked::linear_clamp_run"}
)  # fmt: skip

READ_ELSEWHERE = "operand read after, returned, viewed, or not made fresh in the same block"
SHAPE_UNKNOWN = "binary op outside forward or without example inputs: shapes unknown"
BROADCASTS = "no operand has the result's shape and dtype"
NOT_FLOATING = "dtype unknown or not floating"
NOT_KNOWN = "shape or dtype not known: the method did not run on the example inputs"
NO_PACKED_READER = "binary op whose result no prepacked op reads: no copy to save"
OUT_VARIANT = "op writes its out= argument: no in-place overload takes one"


class UseInplaceOps(ScriptPass):
    """Elementwise ops a prepacked op reads, written into a fresh operand no one else reads after;
    everything else is left out of place, with the reason."""

    optimization = MobileOptimizerType.INSERT_FOLD_PREPACK_OPS
    summary = "elementwise op on a tensor read nowhere else -> its in-place variant"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        skips = Skips()
        rewrites = 0
        for name, graph in zip(ctx.methods, method_graphs(module, ctx.methods), strict=True):
            inputs = ctx.example_inputs if name == "forward" else None
            facts = _facts(module, graph, inputs) if inputs is not None else None
            for node in list(graph.nodes()):
                if node.kind() not in UNARY | BINARY:
                    continue
                target, reason = choose_target(node, facts)
                if reason:
                    skips.add(reason)
                    continue
                assert target is not None
                old = node.output()
                new = _make_inplace(graph, node, target)
                if facts is not None and old in facts:
                    facts[new] = facts[old]
                rewrites += 1
        return PassResult(module, rewrites, dict(skips))


class Fact(NamedTuple):
    """What one run says about a tensor."""

    shape: list[int]
    dtype: int
    floating: bool


Facts = dict[torch._C.Value, Fact]


def choose_target(node: torch._C.Node, facts: Facts | None) -> tuple[int | None, str | None]:
    """Which operand (0, or 1 for a commutative op) ``node`` may write, or why none."""
    kind = node.kind()
    if ops.script_op(node).writes:  # torch.add(a, b, out=buf): the ``out`` overload
        return None, OUT_VARIANT
    candidates = [0, 1] if kind in COMMUTATIVE and _alpha_is_one(node) else [0]
    fresh = [i for i in candidates if _writable(node, node.inputsAt(i))]
    if not fresh:
        return None, READ_ELSEWHERE
    if kind in UNARY:
        value = node.inputsAt(0)
        producer = value.node().kind()
        if producer in PACKED_RUNS:
            return 0, None
        if facts is not None and value not in facts:
            return None, NOT_KNOWN
        floating = facts is not None and facts[value].floating
        return (0, None) if floating else (None, NOT_FLOATING)
    if not _read_by_packed(node.output()):
        return None, NO_PACKED_READER
    if facts is None:
        return None, SHAPE_UNKNOWN
    result = facts.get(node.output())
    operands = [facts.get(node.inputsAt(i)) for i in fresh]
    if result is None or None in operands:
        return None, NOT_KNOWN
    for i, operand in zip(fresh, operands, strict=True):
        if operand == result and result.floating:
            return i, None
    return None, BROADCASTS


def _read_by_packed(value: torch._C.Value) -> bool:
    """Whether a prepacked op reads ``value``, directly or through activations this pass may
    write in place, or already does (one that stays out of place costs a copy, never a wrong
    result)."""
    return any(
        use.user.kind() in PACKED_RUNS
        or (use.user.kind().removesuffix("_") in UNARY and _read_by_packed(use.user.output()))
        for use in value.uses()
    )


def _alpha_is_one(node: torch._C.Node) -> bool:
    inputs = list(node.inputs())
    if not all(isinstance(v.type(), torch._C.TensorType) for v in inputs[:2]):
        return False
    if node.kind() == "aten::mul":
        return len(inputs) == 2
    alpha = inputs[2].node() if len(inputs) == 3 else None
    return alpha is not None and alpha.kind() == "prim::Constant" and alpha.output().toIValue() == 1


def _writable(node: torch._C.Node, value: torch._C.Value) -> bool:
    """No one but ``node`` can see ``value`` written: ``value`` is a tensor made fresh by an op
    in ``node``'s block (perhaps then written in place, ``hardswish_(conv(x))``), and every
    other reader of that tensor, under any name (an in-place op's result, a list holding it),
    runs before ``node`` and returns no view of it."""
    if not isinstance(value.type(), torch._C.TensorType):
        return False
    chain = [value]  # the tensor under each name an in-place op gave it
    while ops.script_op(chain[-1].node()).writes and chain[-1].node().kind().startswith("aten::"):
        chain.append(chain[-1].node().inputsAt(0))
    producer = chain[-1].node()
    if producer.kind() in ("prim::Param", "prim::Constant", "prim::GetAttr"):
        return False
    info = ops.script_op(producer)
    if info.name is None or info.view or info.writes or list(producer.blocks()):
        return False
    block = node.owningBlock()
    if producer.owningBlock() != block:
        return False
    renames = {v.node() for v in chain[:-1]}
    seen = {v.unique() for v in chain}
    aliases = list(chain)
    while aliases:
        alias = aliases.pop()
        for use in alias.uses():
            user = use.user
            if user == node or user in renames:
                continue
            info = ops.script_op(user)
            if user.owningBlock() != block or not user.isBefore(node) or info.view:
                return False
            # The tensor under another name: an in-place op's result (relu_(t) is t), or a
            # list or tuple holding it. Whoever reads those after ``node`` reads the write.
            if info.writes or user.kind() in _CONTAINERS:
                fresh = [out for out in user.outputs() if out.unique() not in seen]
                seen.update(out.unique() for out in fresh)
                aliases.extend(fresh)
    return True


_CONTAINERS = frozenset({"prim::ListConstruct", "prim::TupleConstruct", "prim::DictConstruct"})


def _make_inplace(graph: torch._C.Graph, node: torch._C.Node, target: int) -> torch._C.Value:
    inputs = list(node.inputs())
    if target == 1:
        inputs[0], inputs[1] = inputs[1], inputs[0]
    inplace = graph.create(node.kind() + "_", inputs, 1)
    inplace.insertBefore(node)
    inplace.output().setType(node.output().type())
    node.output().replaceAllUsesWith(inplace.output())
    node.destroy()
    return inplace.output()


# What a run says about each tensor: its sizes, its dtype (the ScalarType's number), whether it
# is floating.
_FACTS = (
    ("aten::size", torch._C.ListType.ofInts()),
    ("prim::dtype", torch._C.IntType.get()),
    ("aten::is_floating_point", torch._C.BoolType.get()),
)


def _facts(
    module: torch.jit.ScriptModule, graph: torch._C.Graph, inputs: Sequence[Any]
) -> Facts | None:
    """What the example inputs say about the tensors of ``graph``'s top-level block: what
    follows from them without a run (``static_shapes``), or, when an op this pass could rewrite
    needs more, one run's (kept to the static facts when the run fails)."""
    facts = {
        value: Fact(list(meta.shape), scalar_type_number(meta.dtype), meta.dtype.is_floating_point)
        for value, meta in static_shapes(module, graph, inputs).items()
    }
    if not any(
        node.kind() in UNARY | BINARY and choose_target(node, facts)[1] == NOT_KNOWN
        for node in graph.nodes()
    ):
        return facts
    probed = _probe(module, graph, inputs)
    return facts if probed is None else probed


def _probe(
    module: torch.jit.ScriptModule, graph: torch._C.Graph, inputs: Sequence[Any]
) -> Facts | None:
    """Shape and dtype of every tensor of ``graph``'s top-level block, from one run on
    ``inputs``; None when the graph does not run on them."""
    tensors = [v for n in graph.nodes() for v in n.outputs() if _is_tensor(v)]
    found = probe(module, graph, tensors, inputs, _FACTS)
    if found is None:
        return None
    return {
        value: Fact(list(size), dtype, floating) for value, (size, dtype, floating) in found.items()
    }


def _is_tensor(value: torch._C.Value) -> bool:
    return isinstance(value.type(), torch._C.TensorType)
