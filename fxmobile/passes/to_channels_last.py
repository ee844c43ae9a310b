"""Run 4-D activations in channels-last (NHWC) memory layout: a layout change, not math.

    def forward(x):                 def forward(x):
        y = self.conv(x)      ->        x_cl = x.contiguous(memory_format=torch.channels_last)
        return y.flatten(1)             y = self.conv(x_cl)        # weight stored channels-last
                                        return y.flatten(1)

Every value keeps its shape and its elements; only the strides change, so the outputs are the
eager ones (conv kernels differ in summation order: rounding differences only). Rewrites:

- **entry**: after each placeholder that the example inputs show to be a 4-D tensor, insert
  ``x.contiguous(memory_format=torch.channels_last)`` and route its users through it (except
  ``return x``: an input returned as is stays the caller's tensor). A conv (and the ops after
  it) then runs NHWC and produces NHWC.
- **conv weights**: the weight of every ``nn.Conv2d`` / ``nn.ConvTranspose2d`` reached from a
  converted input, and every ``get_attr`` weight of ``F.conv2d`` / ``F.conv_transpose2d``, is
  stored channels-last (otherwise the kernel converts it on every call). The module gets a
  *new* ``nn.Parameter`` (same ``requires_grad``); each module slot holding the old tensor gets
  the same new one, so tied weights stay tied, and the old tensor itself is never written to.
  A module called at several sites is fine: the layout changes no call's result. 1x1 and
  depthwise weights (``[O, I, 1, 1]``, ``[C, 1, k, k]``) already are channels-last-contiguous:
  nothing to do for them.
- **constants in arithmetic**: a 4-D ``get_attr`` tensor added to / multiplied with an
  activation reached from a converted input is stored channels-last too. Measured here: a
  channels-last ``[1, 32, 112, 112]`` activation plus a contiguous constant of that shape takes
  about 12 ms against 31 us when both are channels-last (TensorIterator falls off its
  vectorized path on mixed layouts).
- **outputs**: each output that eager returned contiguous (``tensor_meta``) and that the change
  may reach gets ``.contiguous()``. It is free when the output is already contiguous (the call
  returns its input: mobilenet_v2's ``[1, 1000]`` logits), one copy otherwise (measured here:
  about 0.2 ms for a ``[1, 32, 112, 112]`` map, next to tens of ms for the network that made
  it). Callers keep eager's strides, so ``out.view(...)``, ``out.numpy()`` buffers and C code
  reading ``data_ptr`` see the memory order they did before.

When it gives up: without example inputs (``input rank unknown (pass example_inputs)``); on
inputs that are not 4-D tensors, or that reach no 2-D conv (nothing to gain). The whole pass
is declined when a value it reaches meets an op that reads strides (``as_strided``,
``stride()``, ``data_ptr()``, ``is_contiguous()``, ``numpy()``), a module kept with its hooks
(they would see the new layout, and the fake-tensor check below would run them), or the user's
own code (a module of the user's class or a user's function, kept whole by the capture) that
may read them: ``if x.is_contiguous(): ...`` took the other branch (fuzz finding F13).
``fxmobile.passes.user_code`` scans that code's bytecode, and what it follows.

The check: when every op the change reaches is known to take any strides (ATen ops other than
``.view`` / ``.view_as``, the standard leaf modules ``InlineModules`` writes out as one such
call, Python's arithmetic on shapes), the rewritten graph runs as the old one did. Otherwise
(a user's function or module, ``.view``) the rewritten graph is run on fake tensors shaped like
the example inputs, and when it fails (a ``.view`` that needs contiguous memory: use
``.reshape``) every change is undone. Fake tensors run the meta kernels, which pick the same
output layouts as the CPU kernels, without computing anything (resnet50's graph: about 0.03 s).
When the *original* graph does not run on fake tensors either (``.item()`` in a user's
function, ops without a meta kernel), safety cannot be checked and the pass is declined too
("layout change not checked").

Not handled: an op mixing a converted activation with an unconverted 4-D *activation* (a
second input that reaches no conv, say) runs on mixed layouts, slowly (see above); the values
are still right.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.shape_prop import TensorMetadata
from torch.utils._pytree import tree_map_only

from fxmobile import ops
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.graph_utils import attr_of, module_of, tensor_meta, written_in_place
from fxmobile.passes.inline_modules import INLINERS
from fxmobile.passes.stage import FxContext, FxPass
from fxmobile.passes.user_code import may_read_layout

CL = torch.channels_last
CONV_MODULES: tuple[type[nn.Module], ...] = (nn.Conv2d, nn.ConvTranspose2d)
CONV_FUNCTIONS: frozenset[Any] = frozenset({F.conv2d, F.conv_transpose2d})
ARITHMETIC_FUNCTIONS: frozenset[Any] = frozenset(
    {operator.add, operator.sub, operator.mul, operator.truediv,
     torch.add, torch.sub, torch.mul, torch.div}
)  # fmt: skip
ARITHMETIC_METHODS: frozenset[str] = frozenset({"add", "sub", "mul", "div"})

NO_SHAPES = "input rank unknown (pass example_inputs)"
STRIDES = "a value it reaches meets an op that reads strides (as_strided, stride())"
BREAKS = "channels-last breaks a stride-dependent op (e.g. .view: use .reshape)"
UNCHECKED = "layout change not checked: the graph does not run on fake tensors"
HOOKED = "a value it reaches goes through a hooked module (its hooks would see the new layout)"
USERS_CODE = "a value it reaches goes into the user's code, which may read its strides"


def can_convert_input(node: fx.Node, shapes_known: bool) -> str | None:
    """None when placeholder ``node`` is a 4-D tensor input, else the reason to leave it."""
    meta = tensor_meta(node)
    if meta is None:
        return "input is not a tensor" if shapes_known else NO_SHAPES
    if not isinstance(meta, TensorMetadata):
        return "input is not a tensor"
    if len(meta.shape) != 4:
        return "input is not a 4-D tensor"
    if not node.users:
        return "input is unused"
    return None


def _needs_conversion(value: object) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.dim() == 4
        and not value.is_contiguous(memory_format=CL)
    )


def _downstream(starts: Iterable[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(starts)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.users)
    return seen


def _hooked(gm: fx.GraphModule, node: fx.Node) -> bool:
    module = module_of(gm, node)
    return module is not None and ops.has_hooks(module)


def _runs_on_any_layout(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` computes the same, and runs, whatever the strides of its inputs: see
    ``ops.takes_any_layout``; a module call when its exact type's forward is one such call."""
    if node.op in ("placeholder", "get_attr", "output"):
        return True
    if node.op == "call_module":
        module = module_of(gm, node)
        inliner = None if module is None else INLINERS.get(type(module))
        return inliner is not None and inliner(module) is not None
    return ops.takes_any_layout(node)


def _users_code_reads_strides(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` calls the user's own code (a module of a class outside torch, a function
    that is no torch op) and that code may read strides."""
    if node.op == "call_module":
        module = module_of(gm, node)  # torch's own modules are trusted by may_read_layout
        return module is not None and may_read_layout(module)
    if node.op != "call_function" or ops.call_name(node) is not None:
        return False
    target = node.target
    assert callable(target)  # a call_function's target is never a string
    return not ops.takes_any_layout(node) and may_read_layout(target)


def _reads_strides(node: fx.Node) -> bool:
    return node.op != "call_module" and ops.call_name(node) in ops.STRIDE_READERS


@dataclass
class _Plan:
    inputs: list[fx.Node] = field(default_factory=list)
    tensors: dict[int, torch.Tensor] = field(default_factory=dict)  # id -> tensor to convert


def _plan(gm: fx.GraphModule, skips: Skips) -> _Plan:
    plan = _Plan()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    shapes_known = any(tensor_meta(n) is not None for n in gm.graph.nodes)
    for node in placeholders:
        reason = can_convert_input(node, shapes_known)
        if reason is None and written_in_place(gm, node):
            # a converted input is a copy: the forward's write would no longer reach the caller
            reason = "input is written in place by forward"
        if reason is None and not any(_is_conv(gm, n) for n in _downstream([node])):
            # a 4-D input that no conv reads ([B, heads, T, D]) would only pay the copy
            reason = "4-D input reaches no 2-D conv (nothing to gain)"
        if reason is None:
            plan.inputs.append(node)
        else:
            skips.add(reason)
    reached = _downstream(plan.inputs)
    for node in reached:
        weight: object = None
        if node.op == "call_module" and type(module_of(gm, node)) in CONV_MODULES:
            weight = getattr(module_of(gm, node), "weight", None)
        elif node.op == "call_function" and node.target in CONV_FUNCTIONS:
            arg = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
            if isinstance(arg, fx.Node) and arg.op == "get_attr":
                weight = attr_of(gm, arg)
        elif _is_arithmetic(node):
            for arg in node.all_input_nodes:
                others = [n for n in node.all_input_nodes if n is not arg]
                if arg.op == "get_attr" and any(n in reached for n in others):
                    weight = attr_of(gm, arg)
        if _needs_conversion(weight):
            assert isinstance(weight, torch.Tensor)
            plan.tensors[id(weight)] = weight
    return plan


def _is_conv(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        return type(module_of(gm, node)) in CONV_MODULES
    return node.op == "call_function" and node.target in CONV_FUNCTIONS


def _is_arithmetic(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target in ARITHMETIC_FUNCTIONS
    return node.op == "call_method" and node.target in ARITHMETIC_METHODS


def _affected(gm: fx.GraphModule, plan: _Plan) -> set[fx.Node]:
    """Every node whose value may change layout: downstream of inputs and converted tensors."""
    starts = list(plan.inputs)
    for node in gm.graph.nodes:
        if node.op == "get_attr" and id(attr_of(gm, node)) in plan.tensors:
            starts.append(node)
        module = module_of(gm, node)
        if module is not None and id(getattr(module, "weight", None)) in plan.tensors:
            starts.append(node)
    return _downstream(starts)


@dataclass
class _Changes:
    """What was done, so that a failed check can undo it."""

    nodes: list[fx.Node] = field(default_factory=list)
    slots: list[tuple[nn.Module, str, Any]] = field(default_factory=list)

    def undo(self, gm: fx.GraphModule) -> None:
        for node in reversed(self.nodes):
            source = node.args[0]
            assert isinstance(source, fx.Node)
            node.replace_all_uses_with(source)
            gm.graph.erase_node(node)
        for owner, name, old in reversed(self.slots):
            _set_slot(owner, name, old)


def _set_slot(owner: nn.Module, name: str, value: Any) -> None:
    if name in owner._parameters:
        owner._parameters[name] = value
    elif name in owner._buffers:
        owner._buffers[name] = value
    else:
        object.__setattr__(owner, name, value)


def _tensor_slots(gm: fx.GraphModule) -> Iterable[tuple[nn.Module, str, Any]]:
    for owner in gm.modules():
        for name, value in [*owner._parameters.items(), *owner._buffers.items()]:
            yield owner, name, value
        for name, value in vars(owner).items():
            if isinstance(value, torch.Tensor):
                yield owner, name, value


def _channels_last_copy(t: torch.Tensor) -> torch.Tensor:
    data = t.detach().contiguous(memory_format=CL)
    if isinstance(t, nn.Parameter):
        return nn.Parameter(data, requires_grad=t.requires_grad)
    return data


class ToChannelsLast(FxPass):
    """Run 4-D inputs, the conv weights and the 4-D constants they reach in channels-last layout.

    Declines the whole rewrite when a reached op reads strides or a reached module has hooks, or
    when a reached op is not known to take any strides and the rewritten graph fails its
    fake-tensor check.
    """

    optimization = MobileOptimizerType.CHANNELS_LAST
    summary: ClassVar[str] = (
        "4-D input x -> x.contiguous(memory_format=channels_last); conv weights channels-last"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        skips = Skips()
        plan = _plan(gm, skips)
        if not plan.inputs:
            return PassResult(gm, 0, dict(skips))
        affected = _affected(gm, plan)
        if any(_reads_strides(n) for n in affected):
            skips.add(STRIDES)
            return PassResult(gm, 0, dict(skips))
        if any(_hooked(gm, n) for n in affected):
            skips.add(HOOKED)
            return PassResult(gm, 0, dict(skips))
        if any(_users_code_reads_strides(gm, n) for n in affected):
            skips.add(USERS_CODE)
            return PassResult(gm, 0, dict(skips))
        if any(_written_through_reshape(gm, n) for n in affected):
            skips.add(RESHAPED_WRITE)
            return PassResult(gm, 0, dict(skips))
        if ctx.example_inputs is None:  # shapes from another caller's propagation: no check
            skips.add(NO_SHAPES)
            return PassResult(gm, 0, dict(skips))
        unknown = not all(_runs_on_any_layout(gm, n) for n in affected)
        changes = _apply(gm, plan, affected)
        reason = _check(gm, ctx.example_inputs) if unknown else None
        if reason is not None:
            changes.undo(gm)
            if _check(gm, ctx.example_inputs) is not None:
                reason = UNCHECKED
            skips.add(reason)
            return PassResult(gm, 0, dict(skips))
        return PassResult(gm, len(changes.nodes) + len(plan.tensors), dict(skips))


# reshape, flatten, view and contiguous return a view of a contiguous tensor but a copy of a
# channels-last one: a write through them reaches the original only in eager's layout.
RESHAPED_WRITE = "a value is written in place through a reshape (a copy once channels-last)"


def _written_through_reshape(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A user of ``node`` reshapes it (a view only in NCHW) and that result is written."""
    for user in node.users:
        if user.op == "call_module":
            reshaping = isinstance(module_of(gm, user), nn.Flatten | nn.Unflatten)
        else:
            reshaping = ops.call_name(user) in ops.LAYOUT_DEPENDENT_VIEWS
        if reshaping and written_in_place(gm, user):
            return True
    return False


def _apply(gm: fx.GraphModule, plan: _Plan, affected: set[fx.Node]) -> _Changes:
    changes = _Changes()
    graph = gm.graph
    for node in plan.inputs:
        # an input returned as is stays the caller's own tensor, as in eager
        users = [user for user in node.users if user.op != "output"]
        with graph.inserting_after(node):
            cl = graph.call_method("contiguous", (node,), {"memory_format": CL})
        for user in users:
            user.replace_input_with(node, cl)
        changes.nodes.append(cl)
    new = {key: _channels_last_copy(t) for key, t in plan.tensors.items()}
    for owner, name, value in list(_tensor_slots(gm)):
        if id(value) in new:
            changes.slots.append((owner, name, value))
            _set_slot(owner, name, new[id(value)])
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    for leaf in output.all_input_nodes:
        meta = tensor_meta(leaf)
        if leaf not in affected or not isinstance(meta, TensorMetadata):
            continue
        if meta.memory_format is not torch.contiguous_format or len(meta.shape) < 2:
            continue
        with graph.inserting_before(output):
            restored = graph.call_method("contiguous", (leaf,))
        output.replace_input_with(leaf, restored)
        changes.nodes.append(restored)
    return changes


def _check(gm: fx.GraphModule, example_inputs: tuple[Any, ...]) -> str | None:
    """Run ``gm`` on fake copies of the example inputs (tensors inside tuples, lists and dicts
    too; other values as they are): None if it runs."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        inputs = [tree_map_only(torch.Tensor, mode.from_tensor, x) for x in example_inputs]
    try:
        with mode, torch.no_grad():
            fx.Interpreter(gm).run(*inputs)
    except Exception:
        return BREAKS
    return None
