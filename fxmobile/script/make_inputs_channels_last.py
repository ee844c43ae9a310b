"""Run a TorchScript model's 4-D activations channels-last (NHWC), in the frozen graph.

    graph(%self, %x):                       graph(%self, %x):
      %y = prepacked::conv2d_clamp_run(   ->   %x_cl = aten::contiguous(%x, 2)  # channels_last
             %x, %ctx)                          %y = prepacked::conv2d_clamp_run(%x_cl, %ctx)
      ...                                      ...
      return (%out)                            %out_c = aten::contiguous(%out, 0)
                                               return (%out_c)

A layout change, not math: every value keeps its shape and elements. The prepacked kernels
(upstream's XNNPACK ones and fxmobile's) compute in NHWC and return their input's layout, so a
network fed NCHW pays two layout copies at every convolution; fed NHWC, none. This is the
TorchScript twin of the FX pass ``fxmobile.passes.to_channels_last``, for the routes that never
see the FX stage: a ``ScriptModule`` given to ``optimize_for_mobile`` and the traced or scripted
fallbacks. A module the FX stage made is left to that stage's decision (its own
``to_channels_last`` ran, or ``channels_last=False`` asked for eager's layout); a forward whose
input is already made channels-last is left as it is.

Rewrites, in ``forward`` (the only method example inputs describe):

- **entry**: each input that the example inputs show to be a 4-D floating tensor and that
  reaches a prepacked convolution gets ``x.contiguous(memory_format=torch.channels_last)``;
  every user reads that instead (a ``return x`` still returns the caller's tensor).
- **outputs**: each tensor output the change reaches gets ``.contiguous()``, free when it
  already is (logits), so callers see eager's strides; an output that was not contiguous
  before the change declines the input instead.

When it gives up, with the reason: no example inputs (rank unknown), an input the graph writes
in place (the write would land in the copy), and any value the change reaches meeting an op
that reads strides (``stride``, ``is_contiguous``, ``as_strided``...), an op without a schema
(a method or function call, a Python op), a loop, an output in a container it does not
unpack, or a reshape-like op (``view``, ``reshape``, ``flatten``, ``contiguous``...) on a
tensor written in place anywhere in the graph (such an op returns a view of an NCHW tensor
but a copy of an NHWC one, and the write would then miss). Last, the rewritten module runs on
the example inputs: when it raises (a ``view`` that needs NCHW memory) or an output's strides
or values differ from before, every change is undone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fxmobile import ops
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.script.aliasing import root, written_roots
from fxmobile.script.stage import ScriptContext, ScriptPass
from fxmobile.verify import compare_outputs

CHANNELS_LAST = 2  # torch.channels_last as TorchScript's MemoryFormat int
CONTIGUOUS = 0  # torch.contiguous_format
CONVOLUTIONS = frozenset({"prepacked::conv2d_clamp_run", "prepacked::conv2d_transpose_clamp_run"})
# Ops whose result depends on strides, not only on elements.
READS_STRIDES = frozenset(
    {f"aten::{name}" for name in ("stride", "is_contiguous", "as_strided", "as_strided_",
                                  "as_strided_scatter", "set_", "resize_", "resize_as_",
                                  "is_non_overlapping_and_dense", "is_set_to", "data_ptr",
                                  "is_strides_like_format", "sym_stride", "as_strided_copy")}
)  # fmt: skip
# Ops that return a view of an NCHW tensor but may return a copy of an NHWC one.
RESHAPES = frozenset(
    {f"aten::{name}" for name in ("view", "reshape", "flatten", "view_as", "reshape_as",
                                  "contiguous", "unflatten", "_reshape_alias", "unsafe_view")}
)  # fmt: skip
# Nodes that only pack and unpack what they are given.
PASS_THROUGH = frozenset(
    {"prim::ListConstruct", "prim::ListUnpack", "prim::TupleConstruct", "prim::TupleUnpack",
     "prim::TupleIndex", "prim::RaiseException", "prim::If"}
)  # fmt: skip
_CONTAINERS = frozenset({"prim::TupleConstruct", "prim::ListConstruct"})

# The FX stage scripts its graph modules under this prefix; its own channels-last pass (or the
# user's channels_last=False) has decided their layout.
FX_MODULES = "__torch__.torch.fx.graph_module."
FX_ROUTE = "made by the FX stage, whose channels_last option decides the layout"
NO_INPUTS = "input rank unknown (pass example_inputs)"
NO_CONV = "input reaches no 2-D convolution"
ALREADY = "input already made channels-last"
NOT_4D = "input is not a 4-D floating tensor"
INPUT_WRITTEN = "the graph writes its input in place"
NOT_CHECKED = "layout change not checked: the example inputs do not run through forward"
CHANGED = "layout change undone: the rewritten forward differs on the example inputs"


class MakeInputsChannelsLast(ScriptPass):
    """The FX stage's channels-last layout for graphs that skipped it; declines, with the reason,
    whatever reads strides, writes in place or cannot be followed, and undoes itself when the
    example inputs show a change."""

    optimization = MobileOptimizerType.CHANNELS_LAST
    summary = "4-D inputs of prepacked convs -> contiguous(channels_last); outputs contiguous"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        skips = Skips()
        if "forward" not in ctx.methods:
            return PassResult(module, 0, {})
        graph = module._c._get_method("forward").graph
        inputs = list(graph.inputs())[1:]
        if module._c._type().qualified_name().startswith(FX_MODULES):
            skips.add(FX_ROUTE)
            return PassResult(module, 0, dict(skips))
        if ctx.example_inputs is None or len(ctx.example_inputs) != len(inputs):
            if any(_reaches_conv(graph, x) for x in inputs):
                skips.add(NO_INPUTS)
            return PassResult(module, 0, dict(skips))
        chosen = []
        for x, example in zip(inputs, ctx.example_inputs, strict=True):
            reason = why_not_convert(graph, x, example)
            if reason is None:
                chosen.append(x)
            elif reason not in (NOT_4D, NO_CONV):
                skips.add(reason)
        if not chosen:
            return PassResult(module, 0, dict(skips))
        reason = _why_not_outputs(graph, chosen)
        if reason:
            skips.add(reason)
            return PassResult(module, 0, dict(skips))
        try:
            before = run_graph(module, graph, ctx.example_inputs)
        except Exception:
            skips.add(NOT_CHECKED)
            return PassResult(module, 0, dict(skips))
        inserted = _rewrite(graph, chosen)
        if not same(before, module, graph, ctx.example_inputs):
            _undo(inserted)
            skips.add(CHANGED)
            return PassResult(module, 0, dict(skips))
        return PassResult(module, len(chosen), dict(skips))


def why_not_convert(graph: torch._C.Graph, x: torch._C.Value, example: Any) -> str | None:
    """Why input ``x`` may not be made channels-last, or None when it may."""
    if not (
        isinstance(example, torch.Tensor) and example.dim() == 4 and example.is_floating_point()
    ):
        return NOT_4D
    uses = [use.user for use in x.uses()]
    if uses and all(_makes_channels_last(node) for node in uses):
        return ALREADY
    reached, reason = reach(graph, [x])
    if reason:
        return reason
    if not any(n.kind() in CONVOLUTIONS for n in _users_of(graph, reached)):
        return NO_CONV
    if x in written_roots(graph):
        return INPUT_WRITTEN
    return None


def reach(
    graph: torch._C.Graph, sources: Sequence[torch._C.Value]
) -> tuple[set[torch._C.Value], str | None]:
    """Every value computed from ``sources``, and why the layout change may not reach it."""
    reached = set(sources)
    written = written_roots(graph)

    def visit(block: torch._C.Block) -> str | None:
        for node in block.nodes():
            touched = any(v in reached for v in node.inputs())
            if node.kind() == "prim::If":
                for inner in node.blocks():
                    reason = visit(inner)
                    if reason:
                        return reason
                returned = (v for b in node.blocks() for v in b.returnNode().inputs())
                touched = touched or any(v in reached for v in returned)
            elif list(node.blocks()):
                if touched or _reads_any(node, reached):
                    return f"a converted value reaches {node.kind()}"
                continue
            if not touched:
                continue
            reason = _why_not_op(node, written)
            if reason:
                return reason
            reached.update(node.outputs())
        return None

    return reached, visit(graph.block())


def _why_not_op(node: torch._C.Node, written: set[torch._C.Value]) -> str | None:
    kind = node.kind()
    if kind in READS_STRIDES:
        return f"a converted value reaches {kind}, which reads strides"
    if kind in RESHAPES and root(node.inputsAt(0)) in written:
        return f"{kind} of a tensor written in place: a copy, not a view, once channels-last"
    if kind in PASS_THROUGH or kind in CONVOLUTIONS:
        return None
    if kind.startswith("prim::") or ops.script_op(node).name is None:
        return f"a converted value reaches {kind}, which fxmobile cannot check"
    return None


def _reads_any(node: torch._C.Node, values: set[torch._C.Value]) -> bool:
    return any(
        v in values for block in node.blocks() for inner in block.nodes() for v in inner.inputs()
    )


def _users_of(graph: torch._C.Graph, values: set[torch._C.Value]) -> list[torch._C.Node]:
    return [use.user for v in values for use in v.uses()]


def _reaches_conv(graph: torch._C.Graph, x: torch._C.Value) -> bool:
    reached, _ = reach(graph, [x])
    return any(n.kind() in CONVOLUTIONS for n in _users_of(graph, reached))


def _makes_channels_last(node: torch._C.Node) -> bool:
    if node.kind() not in ("aten::contiguous", "aten::to"):
        return False
    last = list(node.inputs())[-1]
    return last.node().kind() == "prim::Constant" and last.toIValue() == CHANNELS_LAST


def _returned(graph: torch._C.Graph) -> list[tuple[torch._C.Node, int, torch._C.Value]]:
    """(node, input index, value) of every returned value, tuples and lists unpacked once."""
    slots = []
    ret = graph.return_node()
    for i, v in enumerate(ret.inputs()):
        if v.node().kind() in _CONTAINERS and len(v.uses()) == 1:
            slots += [(v.node(), j, e) for j, e in enumerate(v.node().inputs())]
        else:
            slots.append((ret, i, v))
    return slots


def _why_not_outputs(graph: torch._C.Graph, sources: list[torch._C.Value]) -> str | None:
    reached, _ = reach(graph, sources)
    for _, _, v in _returned(graph):
        if v in reached and not isinstance(v.type(), torch._C.TensorType) and v not in sources:
            return "an output holds converted tensors in a container fxmobile does not unpack"
    return None


def _constant(graph: torch._C.Graph, value: int, before: torch._C.Node) -> torch._C.Value:
    g: Any = graph  # torch's stubs omit insertConstant
    with graph.insert_point_guard(before):
        constant: torch._C.Value = g.insertConstant(value)
    return constant


def _contiguous(
    graph: torch._C.Graph, x: torch._C.Value, fmt: int, before: torch._C.Node
) -> torch._C.Node:
    node = graph.create("aten::contiguous", [x, _constant(graph, fmt, before)], 1)
    node.insertBefore(before)
    node.output().setType(x.type())
    return node


def _rewrite(graph: torch._C.Graph, chosen: list[torch._C.Value]) -> list[torch._C.Node]:
    """Insert the conversions; the nodes inserted, for ``_undo``."""
    inserted = []
    first = next(iter(graph.nodes()))
    for x in chosen:
        uses = [(use.user, use.offset) for use in x.uses()]
        node = _contiguous(graph, x, CHANNELS_LAST, first)
        for user, offset in uses:
            if user is not graph.return_node():
                user.replaceInput(offset, node.output())
        inserted.append(node)
    reached, _ = reach(graph, [n.output() for n in inserted])
    for user, offset, v in _returned(graph):
        if v in reached and isinstance(v.type(), torch._C.TensorType):
            node = _contiguous(graph, v, CONTIGUOUS, user)
            user.replaceInput(offset, node.output())
            inserted.append(node)
    return inserted


def _undo(inserted: list[torch._C.Node]) -> None:
    for node in reversed(inserted):
        node.output().replaceAllUsesWith(node.inputsAt(0))
        node.destroy()


def run_graph(module: torch.jit.ScriptModule, graph: torch._C.Graph, inputs: Sequence[Any]) -> Any:
    """Run ``graph`` as it is now (the module's method would run the plan it compiled before a
    rewrite) with ``module`` as ``self``, on copies of ``inputs``."""
    fn = torch._C._create_function_from_graph("fxmobile_probe", graph.copy())
    with torch.no_grad():
        return fn(module._c, *[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def same(
    before: Any, module: torch.jit.ScriptModule, graph: torch._C.Graph, inputs: Sequence[Any]
) -> bool:
    """The rewritten graph runs on ``inputs``, with the strides and (to rounding) the values
    it had before."""
    try:
        after = run_graph(module, graph, inputs)
    except Exception:
        return False
    old, new = _tensors(before), _tensors(after)
    if len(old) != len(new) or any(a.stride() != b.stride() for a, b in zip(old, new, strict=True)):
        return False
    return all(check.passed for check in compare_outputs(before, after, 1e-4))
