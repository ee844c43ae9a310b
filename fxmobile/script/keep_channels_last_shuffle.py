"""Keep a channels-last network channels-last through a channel shuffle (ShuffleNet's idiom).

    v = x.view(b, g, c // g, h, w)          v = x.view(b, g, c // g, h, w)
    t = v.transpose(1, 2)             ->    t = v.transpose(1, 2)
    s = t.contiguous()                      y = torch.empty_like(x, memory_format=channels_last)
    y = s.view(b, c, h, w)                  y.view(b, c // g, g, h, w).copy_(t)

``contiguous`` lays ``t`` out NCHW, so ``y`` comes out NCHW and every convolution after it
converts to NHWC and back (upstream's XNNPACK ops and fxmobile's kernels both compute in NHWC
and return their input's layout). The rewrite writes the same elements, with the same one copy,
into a channels-last tensor of ``x``'s shape: ``y[:, i*g + j] = t[:, i, j]`` either way, and
``y.view(b, c // g, g, h, w)`` exists exactly when the first view did (``g * (c // g) == c``).
A freshly allocated ``y`` has channels-last strides in every dimension, which the kernels'
layout test needs (a ``reshape`` of a permuted copy leaves a batch-1 stride that makes them
take it for NCHW).

Only the exact idiom: the last view's sizes are ``x``'s own (``b``, ``h`` and ``w`` the values
of the first view, the channels read from ``x.size()``), the shuffled tensor has no other
user, the layout change already reached ``x`` (a forward input made channels-last by the FX
stage's ``to_channels_last`` or by ``make_inputs_channels_last``) and nothing in the chain is
written in place. The rewritten forward is run on the example inputs and every change is
undone when an output's values or strides differ from before.
"""

from __future__ import annotations

from typing import Any

import torch

from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.script.aliasing import root, written_roots
from fxmobile.script.graph_utils import constant
from fxmobile.script.make_inputs_channels_last import (
    CHANNELS_LAST,
    CONTIGUOUS,
    reach,
    run_graph,
    same,
)
from fxmobile.script.stage import ScriptContext, ScriptPass

NOT_REACHED = "shuffle input not channels-last"
SHARED = "shuffled tensor has other users"
OTHER_SHAPE = "the shuffle's last view is not to its input's shape"
WRITTEN = "a tensor of the shuffle is written in place"
NOT_CHECKED = "not checked: the example inputs do not run through forward"
CHANGED = "undone: the rewritten forward differs on the example inputs"


class KeepChannelsLastShuffle(ScriptPass):
    """ShuffleNet's channel shuffle written as one channels-last copy; any other shuffle, or one
    whose tensors are written in place or read elsewhere, is left with the reason."""

    optimization = MobileOptimizerType.CHANNELS_LAST
    summary = "channel shuffle (view, transpose, contiguous, view) -> a channels-last copy"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        skips = Skips()
        if "forward" not in ctx.methods or ctx.example_inputs is None:
            return PassResult(module, 0, {})
        graph = module._c._get_method("forward").graph
        shuffles = [n for n in graph.nodes() if _is_shuffle(n)]
        if not shuffles:
            return PassResult(module, 0, {})
        reached, reason = reach(graph, _converted_inputs(graph))
        written = written_roots(graph)
        chosen = []
        for node in shuffles:
            why = why_not_rewrite(node, reached if reason is None else set(), written)
            if why:
                skips.add(why)
            else:
                chosen.append(node)
        if not chosen:
            return PassResult(module, 0, dict(skips))
        try:
            before = run_graph(module, graph, ctx.example_inputs)
        except Exception:
            skips.add(NOT_CHECKED)
            return PassResult(module, 0, dict(skips))
        done = [_rewrite(graph, node) for node in chosen]
        if not same(before, module, graph, ctx.example_inputs):
            for last, inserted in reversed(done):
                _undo(last, inserted)
            skips.add(CHANGED)
            return PassResult(module, 0, dict(skips))
        for last, _ in done:
            _finish(last)
        return PassResult(module, len(chosen), dict(skips))


def _is_shuffle(node: torch._C.Node) -> bool:
    """``contiguous(transpose(view(x, [5 sizes]), 1, 2))``, NCHW format."""
    if node.kind() != "aten::contiguous" or constant(node.inputsAt(1)) != CONTIGUOUS:
        return False
    transpose = node.inputsAt(0).node()
    if transpose.kind() != "aten::transpose":
        return False
    if sorted([constant(transpose.inputsAt(1)), constant(transpose.inputsAt(2))]) != [1, 2]:
        return False
    view = transpose.inputsAt(0).node()
    if view.kind() != "aten::view":
        return False
    sizes = view.inputsAt(1).node()
    return sizes.kind() == "prim::ListConstruct" and len(list(sizes.inputs())) == 5


def _converted_inputs(graph: torch._C.Graph) -> list[torch._C.Value]:
    inputs = set(list(graph.inputs())[1:])
    return [
        n.output()
        for n in graph.nodes()
        if n.kind() == "aten::contiguous"
        and n.inputsAt(0) in inputs
        and constant(n.inputsAt(1)) == CHANNELS_LAST
    ]


def why_not_rewrite(
    shuffle: torch._C.Node, reached: set[torch._C.Value], written: set[torch._C.Value]
) -> str | None:
    """None when ``shuffle`` (the shuffle's ``contiguous``) may become a channels-last copy, else
    why not."""
    view = shuffle.inputsAt(0).node().inputsAt(0).node()
    uses = shuffle.output().uses()
    if len(uses) != 1 or uses[0].user.kind() != "aten::view" or uses[0].offset != 0:
        return SHARED
    if not _back_to_input_shape(view, uses[0].user):
        return OTHER_SHAPE
    if view.inputsAt(0) not in reached:
        return NOT_REACHED
    last = uses[0].user.output()
    if root(view.inputsAt(0)) in written or root(last) in written or last in written:
        return WRITTEN
    return None


def _back_to_input_shape(view: torch._C.Node, last: torch._C.Node) -> bool:
    """The last view's sizes are ``[b, c, h, w]`` of the first view's input ``x``."""
    x = view.inputsAt(0)
    first = list(view.inputsAt(1).node().inputs())
    sizes = last.inputsAt(1).node()
    if sizes.kind() != "prim::ListConstruct" or len(list(sizes.inputs())) != 4:
        return False
    b, c, h, w = sizes.inputs()
    return (b, h, w) == (first[0], first[3], first[4]) and _channels_of(c, x)


def _channels_of(value: torch._C.Value, x: torch._C.Value) -> bool:
    """``value`` is ``x.size(1)``, ``x.size()[1]`` or the second of ``x.size()`` unpacked."""
    node = value.node()
    if node.kind() == "aten::size" and len(list(node.inputs())) == 2:
        return node.inputsAt(0) == x and constant(node.inputsAt(1)) == 1
    if node.kind() == "aten::__getitem__":
        source = node.inputsAt(0).node()
        return (
            source.kind() == "aten::size"
            and source.inputsAt(0) == x
            and len(list(source.inputs())) == 1
            and constant(node.inputsAt(1)) == 1
        )
    if node.kind() == "prim::ListUnpack":
        source = node.inputsAt(0).node()
        return (
            source.kind() == "aten::size"
            and source.inputsAt(0) == x
            and (list(node.outputs()).index(value) == 1)
        )
    return False


def _rewrite(graph: torch._C.Graph, shuffle: torch._C.Node) -> tuple[torch._C.Node, list[Any]]:
    """Insert the channels-last shuffle and route the last view's users to it; the last view
    and the values inserted, for ``_undo`` or ``_finish``."""
    g: Any = graph  # torch's stubs omit insertConstant and Graph.insert's list form
    last = shuffle.output().uses()[0].user
    t = shuffle.inputsAt(0)
    view = t.node().inputsAt(0).node()
    x = view.inputsAt(0)
    b, groups, per_group, h, w = view.inputsAt(1).node().inputs()
    with graph.insert_point_guard(last):
        none, fmt = g.insertConstant(None), g.insertConstant(CHANNELS_LAST)
        empty = graph.create("aten::empty_like", [x, none, none, none, none, fmt], 1)
        empty.insertBefore(last)
        y = empty.output()
        sizes = graph.create("prim::ListConstruct", [b, per_group, groups, h, w], 1)
        sizes.insertBefore(last)
        sizes.output().setType(view.inputsAt(1).type())
        y5 = g.insert("aten::view", [y, sizes.output()])
        copied = g.insert("aten::copy_", [y5, t])
    y.setType(last.output().type())
    for value in (y5, copied):
        value.setType(t.type())
    last.output().replaceAllUsesWith(y)
    return last, [copied, y5, sizes.output(), y, fmt, none]


def _undo(last: torch._C.Node, inserted: list[Any]) -> None:
    inserted[3].replaceAllUsesWith(last.output())
    for value in inserted:
        value.node().destroy()


def _finish(last: torch._C.Node) -> None:
    shuffle = last.inputsAt(0).node()
    last.destroy()
    shuffle.destroy()
