"""Fold subgraphs that depend only on parameters, buffers and Python constants.

    y = F.conv2d(x, self.w * self.scale, self.b.repeat(1))
        ->  y = F.conv2d(x, self._folded_0, self._folded_1)
    y = x @ self.weight.t()        ->  y = x @ self._folded_0
    y = x + torch.ones(3) * 2      ->  y = x + self._folded_0

A node is *constant* when it is a ``get_attr``, or a pure call whose inputs are all constant
(a factory call such as ``torch.ones(3)`` has none). Every constant node is evaluated once, in
graph order, on the module's real tensors, exactly as the graph would run it (same op, same
dtype, same device: no float64 here, the folded value is what the graph would have computed).
Each *output* of a maximal constant subgraph (a constant node with a non-constant user) becomes
a buffer (``_folded_<i>``) read by a new ``get_attr``; one rewrite is counted per output
replaced, and the constant nodes left without users are erased with the attributes they read.
A result that views a parameter or a larger tensor is copied (a buffer must not keep a larger
storage alive); a result that *is* an existing attribute (``w.float()`` on a float ``w``) is
read from that attribute instead of being copied.

What is never a constant, and why (each reported as a skip when all inputs were constant):

- random ops: ``torch.rand*``, ``randperm``, ``bernoulli``, ``multinomial``, ``normal``,
  ``poisson``, dropout with ``training`` not constant False, modules in training mode. A
  guard (``constant_guard``: a dispatch mode around each evaluation) also refuses any aten op tagged
  ``nondeterministic_seeded`` *before* it runs, so the global RNG is never consumed;
- ``torch.empty*`` / ``new_empty*``: uninitialized memory is not a value;
- ``F.batch_norm`` / ``F.instance_norm`` that update running statistics (``training=True``);
- impure nodes (``graph_utils.is_pure``: in-place ops, ``out=``, ``setitem``, in-place
  modules) and ``call_module`` of anything outside ``torch.nn``; the guard also refuses any
  op that would write to a parameter, a buffer or an earlier constant;
- ``call_function`` of a function from outside torch (a wrapped user function may have side
  effects fxmobile cannot see); ``operator`` functions, ``getattr`` and ``len`` are allowed;
- constants the graph mutates: when a node that may write (an impure node: ``w.add_(1)``,
  ``w[0] = x``, an opaque leaf module; a BatchNorm in training mode; ``F.batch_norm`` with
  ``training=True``; a node the guard caught writing) receives a constant, every constant
  sharing storage with it, and everything computed from those, stays in the graph: a buffer
  would carry the mutation into the next call. An opaque leaf's own parameters count as
  written too. Limitation: a mutation reached only through a non-constant view of a constant
  (``torch.broadcasttensors(x, w)[1].add_(1)``) is not seen.

What is constant but not folded (skip reasons):

- a result that is not a tensor or a tuple of tensors (``w.shape[0]``, ``w.dtype``);
- a result more than 4x the bytes of the parameters it is computed from and over 1 MiB
  (``w.expand(...)``, ``torch.zeros(4096, 4096)``): "folded result would grow the model";
- a constant returned by ``forward``: eager returns a fresh tensor on each call, a buffer
  would be shared with (and mutable by) the caller.

A declined output leaves the graph and its constant inputs become outputs in turn, so
``(self.w * 2).expand(...)`` still folds ``self.w * 2``. A ``get_attr`` alone is left as is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import fx, nn

from fxmobile import ops
from fxmobile.capture.mutation import storage_key
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.constant_guard import (
    MUTATES,
    RANDOM,
    ConstantGuard,
    NotConstantError,
    storages,
    tensors,
)
from fxmobile.passes.graph_utils import (
    add_constant,
    attr_of,
    erase_unused_attributes,
    is_pure,
    module_of,
)
from fxmobile.passes.remove_dropout import DROPOUT_FUNCTIONS
from fxmobile.passes.stage import FxContext, FxPass

GROWTH_FACTOR = 4
GROWTH_MIN_BYTES = 1 << 20

UNINITIALIZED = "uninitialized tensor (torch.empty) is not a constant"
INPLACE = "in-place or side-effecting op is not folded"


STATS = "updates running statistics (training=True)"


def _flag_set(node: fx.Node, position: int, keyword: str, default: bool) -> bool:
    value = node.args[position] if len(node.args) > position else node.kwargs.get(keyword, default)
    return value is not False


def _is_random(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A random op (``fxmobile.ops``: tagged ``nondeterministic_seeded``); a dropout call is
    random unless its ``training`` argument is the constant False."""
    if node.op == "call_function" and node.target in DROPOUT_FUNCTIONS:
        return _flag_set(node, *DROPOUT_FUNCTIONS[node.target])
    info = ops.fx_op(gm, node)
    return node.op in ("call_method", "call_function") and info.random and info is not ops.UNKNOWN


def _is_uninitialized(node: fx.Node) -> bool:
    return ops.call_name(node) in ops.UNINITIALIZED if node.op != "call_module" else False


def _may_write(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` may mutate its inputs (fx calls random ops impure: they do not write).

    Beyond ``is_pure``: a module with buffers in training mode (BatchNorm updates its running
    stats) and ``F.batch_norm(..., training=True)`` write too.
    """
    if node.op in ("placeholder", "output", "get_attr"):
        return False
    module = module_of(gm, node)
    if module is not None and any(m.training for m in module.modules()):
        return any(True for _ in module.buffers()) or not is_pure(gm, node)
    if node.op == "call_function" and node.target in ops.STATS_FUNCTIONS:
        return _flag_set(node, *ops.STATS_FUNCTIONS[node.target])
    if is_pure(gm, node):
        return False
    # fx calls random ops impure (they draw from the generator); only in-place ones
    # (``inplace=True``, ``F.rrelu_``, ``x.bernoulli_()``) also write
    writes = node.kwargs.get("inplace") or (node.op != "call_module" and ops.call_op(node).writes)
    return not (_is_random(gm, node) and not writes)


def why_not_constant(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """None when ``node`` may be evaluated once given constant inputs, else the reason not."""
    if node.op == "call_function" and ops.call_op(node) is ops.UNKNOWN:
        return "function outside torch not known to be pure"
    if _is_random(gm, node):
        return RANDOM
    if _is_uninitialized(node):
        return UNINITIALIZED
    stats = node.op == "call_function" and node.target in ops.STATS_FUNCTIONS
    if stats and _flag_set(node, *ops.STATS_FUNCTIONS[node.target]):
        return STATS
    if not is_pure(gm, node):
        module = module_of(gm, node)
        if module is not None and not getattr(module, "inplace", False):
            return "module not known to be pure"
        return INPLACE
    if node.op == "call_module":
        module = module_of(gm, node)
        assert module is not None
        if any(m.training for m in module.modules()):
            return "module in training mode (may be random or update its state)"
    return None


def why_not_foldable(node: fx.Node, value: Any, input_nbytes: int) -> str | None:
    """None when the constant ``node`` (with ``value``) may become a buffer, else the reason."""
    if any(user.op == "output" for user in node.users):
        return "constant returned as a model output"
    is_tensor = isinstance(value, torch.Tensor)
    is_tuple = isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value)
    if not (is_tensor or (is_tuple and value)):
        return "folded result is not a tensor or a tuple of tensors"
    nbytes = sum(t.numel() * t.element_size() for t in tensors(value))
    if nbytes > GROWTH_FACTOR * input_nbytes and nbytes > GROWTH_MIN_BYTES:
        return "folded result would grow the model"
    return None


class FoldConstants(FxPass):
    """Replace each output of a constant subgraph with a buffer computed once, at optimization time.

    Leaves random, uninitialized, impure and mutated values, results that are not tensors, would
    grow the model or are returned by ``forward``.
    """

    optimization = MobileOptimizerType.FOLD_CONSTANTS
    summary: ClassVar[str] = "f(self.w, self.b, 2.0) -> self._folded_i (computed once)"

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        skips = Skips()
        values, writers = _evaluate_constants(gm, skips)
        _drop_mutated(gm, values, writers, skips)
        outputs = _choose_outputs(gm, values, skips)
        copies: list[tuple[torch.Tensor, str]] = []
        for node in outputs:
            _replace_with_attributes(gm, node, values[node], copies)
        rewrites = len(outputs)
        if rewrites:
            _erase_dead(gm, outputs, values)
            erase_unused_attributes(gm)
        return PassResult(gm, rewrites, dict(skips))


def _evaluate_constants(
    gm: fx.GraphModule, skips: Skips
) -> tuple[dict[fx.Node, Any], set[fx.Node]]:
    """The value of every constant node, in graph order, and the nodes the guard saw write."""
    values: dict[fx.Node, Any] = {}
    writers: set[fx.Node] = set()
    protected = storages([*gm.parameters(), *gm.buffers()])
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "get_attr":
            values[node] = attr_of(gm, node)
            protected |= storages(values[node])
            continue
        if any(n not in values for n in node.all_input_nodes):
            continue
        reason = why_not_constant(gm, node)
        if reason is None:
            try:
                values[node] = _run(gm, node, values, protected)
            except NotConstantError as exc:
                reason = str(exc)
                if reason == MUTATES:
                    writers.add(node)
            except Exception as exc:
                reason = f"could not evaluate constant ({type(exc).__name__})"
        if reason is not None:
            skips.add(reason)
            continue
        protected |= storages(values[node])
    return values, writers


def _run(gm: fx.GraphModule, node: fx.Node, values: dict[fx.Node, Any], protected: set[int]) -> Any:
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
    with torch.no_grad(), ConstantGuard(protected):
        if node.op == "call_function":
            assert callable(node.target)
            return node.target(*args, **kwargs)
        if node.op == "call_method":
            self_obj, *rest = args
            return getattr(self_obj, str(node.target))(*rest, **kwargs)
        module = module_of(gm, node)
        assert isinstance(module, nn.Module)
        return module(*args, **kwargs)


def _drop_mutated(
    gm: fx.GraphModule, values: dict[fx.Node, Any], writers: set[fx.Node], skips: Skips
) -> None:
    """Remove from ``values`` every constant an impure node may write to, and what uses it."""
    mutated: set[int] = set()
    for node in gm.graph.nodes:
        if node in values or not (node in writers or _may_write(gm, node)):
            continue
        for arg in node.all_input_nodes:
            if arg in values:
                mutated |= storages(values[arg])
        module = module_of(gm, node)
        if module is not None:
            mutated |= storages([*module.parameters(), *module.buffers()])
    if not mutated:
        return
    for node in list(values):
        tainted = bool(storages(values[node]) & mutated)
        if tainted or any(n not in values for n in node.all_input_nodes):
            del values[node]
            if node.op != "get_attr":
                skips.add("constant is mutated in place by the graph")


def _choose_outputs(gm: fx.GraphModule, values: dict[fx.Node, Any], skips: Skips) -> list[fx.Node]:
    """The constant nodes to replace by buffers: those with a non-constant user."""
    folded = set(values)
    accepted: set[fx.Node] = set()
    changed = True
    while changed:
        changed = False
        for node in gm.graph.nodes:
            if node not in folded or node in accepted or node.op == "get_attr":
                continue
            if all(user in folded for user in node.users):
                continue
            reason = why_not_foldable(node, values[node], _input_nbytes(node, values))
            if reason is None:
                accepted.add(node)
            else:
                skips.add(reason)
                folded.discard(node)
                changed = True
    return [n for n in gm.graph.nodes if n in accepted]


def _input_nbytes(node: fx.Node, values: dict[fx.Node, Any]) -> int:
    """Bytes of the attributes ``node`` is computed from, each storage counted once."""
    seen: set[fx.Node] = set()
    stack = [node]
    sizes: dict[int, int] = {}
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "get_attr":
            for t in tensors(values[n]):
                key = storage_key(t)
                if key is not None:
                    sizes[key] = t.untyped_storage().nbytes()
        stack.extend(n.all_input_nodes)
    return sum(sizes.values())


def _attributes(gm: fx.GraphModule) -> Iterable[tuple[str, torch.Tensor]]:
    yield from gm.named_parameters()
    yield from gm.named_buffers()


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(
        storage_key(a) == storage_key(b)
        and a.storage_offset() == b.storage_offset()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def _buffer_for(
    gm: fx.GraphModule, value: torch.Tensor, copies: list[tuple[torch.Tensor, str]]
) -> str:
    """The attribute holding ``value``: an existing one it is, else a new buffer.

    A view (``w.t()``, ``w[0]``, a chunk of an intermediate) is copied, keeping the strides the
    graph computed (``preserve_format``): stored as is, it would keep the whole storage it views
    alive. A view no dense copy has the strides of (``w[:, ::2]``) is stored as is, since later
    ops may read its strides. ``copies`` remembers the views already copied in this run, so
    ``w[0]`` read twice is stored once.
    """
    key = storage_key(value)
    if key is None:
        return _new_buffer(gm, value)
    is_view = value.untyped_storage().nbytes() > value.numel() * value.element_size()
    for name, attr in _attributes(gm):
        if storage_key(attr) != key:
            continue
        if _same_tensor(attr, value):
            return name
        is_view = True
    if not is_view:
        return _new_buffer(gm, value)
    for view, name in copies:
        if _same_tensor(view, value):
            return name
    copy = value.clone(memory_format=torch.preserve_format)
    name = _new_buffer(gm, copy if copy.stride() == value.stride() else value)
    copies.append((value, name))
    return name


def _new_buffer(gm: fx.GraphModule, value: torch.Tensor) -> str:
    index = 0
    while hasattr(gm, f"_folded_{index}"):
        index += 1
    return add_constant(gm, f"_folded_{index}", value)


def _replace_with_attributes(
    gm: fx.GraphModule, node: fx.Node, value: Any, copies: list[tuple[torch.Tensor, str]]
) -> None:
    graph = gm.graph
    with graph.inserting_before(node):
        if isinstance(value, torch.Tensor):
            replacement: Any = graph.get_attr(_buffer_for(gm, value, copies))
        else:  # a tuple of tensors: users get a tuple of get_attr nodes
            replacement = tuple(graph.get_attr(_buffer_for(gm, t, copies)) for t in value)
    if isinstance(replacement, fx.Node):
        node.replace_all_uses_with(replacement)
        return
    for user in list(node.users):
        user.args = fx.node.map_arg(user.args, lambda n: replacement if n is node else n)
        user.kwargs = fx.node.map_arg(user.kwargs, lambda n: replacement if n is node else n)


def _erase_dead(gm: fx.GraphModule, outputs: list[fx.Node], values: dict[fx.Node, Any]) -> None:
    """Erase the replaced outputs and the constant nodes only they used."""
    stack = list(outputs)
    while stack:
        node = stack.pop()
        if node not in values or node.users:
            continue
        inputs = node.all_input_nodes
        gm.graph.erase_node(node)
        values.pop(node)
        stack.extend(inputs)
