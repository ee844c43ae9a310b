"""Subgraphs whose value does not depend on the inputs, computed once into buffers.

    y = x + f(self.w, arange(7), 2.0)           ->  y = x + self._folded_0
    m = new_zeros(x, [H, W]); m[:, 3:] = 1.0     ->  m = self._folded_1     (x's dtype only)
    b = self.table[self.index]                   ->  b = self._folded_2

A node is *constant* when it is a ``get_attr`` of a tensor, or an ATen operator whose tensor
inputs are all constant. ``METADATA_ONLY`` factories count too (``x.new_zeros(...)``,
``zeros_like(x)``): they read only their input's shape, dtype and device, which a program
exported with static shapes fixes. Each constant node is evaluated once, in graph order, on the
module's real tensors, by the same operator: same dtype, the value the program would compute on
every call. Each constant node with a user that is not constant becomes a buffer, and what only
it used is erased. Swin's shifted-window masks, its relative-position-bias gathers and
EdgeNeXt's positional encoding are such subgraphs: rebuilt on every call from ``arange``,
``cumsum``, ``slice_scatter``, ``index`` and integer casts, which XNNPACK has no kernel for,
dozens of portable ops per inference.

This is the FX stage's ``fold_constants`` on ATen, and shares its rules: which constant nodes
become buffers, the size bound (a result more than 4x the bytes of the tensors it is computed
from and over 1 MiB is left, ``fold_constants.why_not_foldable``: the growth is paid in the
program file and in the phone's memory on every load, against the run time of ops that, being
input-independent, run at most once per call), a result that is an attribute already reused, a
view copied. What differs is how a node is judged:

- an ATen node is an operator overload, judged by ``fxmobile.ops``' facts about its overload
  packet and by its own schema for writes (``aten.operator_facts``): random ops (``rand``,
  ``bernoulli``) and ops that write (``copy_``, how the unlifted graph writes a buffer the model
  updates) are never constant, nor ``empty`` (uninitialized); the weight standardization of
  timm's NF-Nets (``_native_batch_norm_legit.no_stats`` of a parameter, an overload that writes
  nothing) is;
- export adds assertions (``_assert_tensor_metadata`` before every ``.to()``), which fx calls
  impure, so the FX fold would keep every constant they read; here an assertion on constants is
  checked once (it holds on every call if it holds now) and dropped with the subgraph;
- ``x.new_zeros(...)`` names the input ``x``: the metadata-only factories above;
- a buffer is stored contiguous, whatever strides the constant ops left (a transposed
  parameter): the program's constants keep the default dim order.

Never folded (skip reasons): random ops, ops that write or leave memory uninitialized, ops other
than ATen's, a failed assertion, a constant the graph writes to (a buffer updated in place, and
everything computed from it), and what ``why_not_foldable`` refuses: a constant returned as an
output, a result that is not a tensor, one that would grow the model.
"""

from __future__ import annotations

import operator
from typing import Any, ClassVar

import torch
from torch import fx

from fxmobile import ops
from fxmobile.executorch.passes.aten import aten, operator_facts, tensor
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.constant_guard import (
    RANDOM,
    ConstantGuard,
    NotConstantError,
    storages,
    tensors,
)
from fxmobile.passes.fold_constants import (
    UNINITIALIZED,
    _choose_outputs,
    _erase_dead,
    _replace_with_attributes,
)
from fxmobile.passes.graph_utils import attr_of, erase_unused_attributes
from fxmobile.passes.stage import FxContext, FxPass

# Factories whose first argument is read only for its shape, dtype and device.
METADATA_ONLY = frozenset(
    {
        aten.new_zeros.default,
        aten.new_ones.default,
        aten.new_full.default,
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.full_like.default,
    }
)
# Checks export adds: they return nothing and raise when their input is not as recorded.
ASSERTIONS = frozenset(
    {
        aten._assert_tensor_metadata.default,
        aten._assert_async.default,
        aten._assert_async.msg,
        aten._assert_scalar.default,
    }
)

WRITES = "writes in place"
WRITTEN = "constant is written in place by the graph (a buffer the model updates)"
NOT_ATEN = "not an ATen operator"
SIDE_EFFECT = "op with a side effect"
FAILED = "assertion on constants fails"
METADATA_UNKNOWN = "input metadata unknown (pass example_inputs)"


def why_not_constant(node: fx.Node) -> str | None:
    """None when ``node`` computes the same on every call given constant inputs, else why not."""
    if node.target is operator.getitem:
        return None
    facts = operator_facts(node.target)
    if facts is None:
        return NOT_ATEN
    if facts.random:
        return RANDOM
    if facts.writes:
        return WRITES
    if facts.name in ops.UNINITIALIZED:
        return UNINITIALIZED
    if node.target in ASSERTIONS:
        return None
    if node.is_impure():
        return SIDE_EFFECT
    return None


def constant_inputs(node: fx.Node) -> list[fx.Node]:
    """The nodes ``node``'s value is computed from (a metadata-only factory's input is not)."""
    if node.target in METADATA_ONLY:
        return [n for n in node.all_input_nodes if n is not node.args[0]]
    return node.all_input_nodes


def _stand_in(node: Any) -> torch.Tensor | None:
    """A tensor of ``node``'s shape, dtype and device, or None when they are unknown."""
    found = tensor(node)
    try:
        sizes = [int(d) for d in found.shape]
    except (AttributeError, TypeError):  # no record, or a symbolic size
        return None
    return torch.zeros(sizes, dtype=found.dtype, device=getattr(found, "device", "cpu"))


def evaluate(gm: fx.GraphModule, skips: Skips) -> tuple[dict[fx.Node, Any], list[fx.Node]]:
    """The value of every constant node, in graph order, and the assertions that held."""
    values: dict[fx.Node, Any] = {}
    held: list[fx.Node] = []
    protected = storages([*gm.parameters(), *gm.buffers()])
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = attr_of(gm, node)
            if isinstance(value, torch.Tensor):
                values[node] = value
                protected |= storages(value)
            continue
        if node.op != "call_function" or any(n not in values for n in constant_inputs(node)):
            continue
        reason = why_not_constant(node)
        if reason is None and _read_for_metadata(node, values) and _stand_in(node.args[0]) is None:
            reason = METADATA_UNKNOWN
        if reason is None:
            try:
                values[node] = _run(node, values, protected)
            except NotConstantError as exc:
                reason = str(exc)
            except Exception as exc:  # an assertion that fails, or an op that cannot run
                failed = f"could not evaluate constant ({type(exc).__name__})"
                reason = FAILED if node.target in ASSERTIONS else failed
        if reason is not None:
            skips.add(reason)
            continue
        if node.target in ASSERTIONS:
            held.append(node)
        protected |= storages(values[node])
    return values, held


def _read_for_metadata(node: fx.Node, values: dict[fx.Node, Any]) -> bool:
    """Whether ``node`` is a metadata-only factory of a tensor that is not constant."""
    return node.target in METADATA_ONLY and node.args[0] not in values


def _run(node: fx.Node, values: dict[fx.Node, Any], protected: set[int]) -> Any:
    def value(n: fx.Node) -> Any:
        if n not in values:  # a metadata-only factory's input: its shape, dtype and device
            return _stand_in(n)
        return values[n]

    args, kwargs = fx.node.map_arg((node.args, node.kwargs), value)
    assert callable(node.target)
    with torch.no_grad(), ConstantGuard(protected):
        return node.target(*args, **kwargs)


def drop_written(gm: fx.GraphModule, values: dict[fx.Node, Any], skips: Skips) -> None:
    """Remove from ``values`` every constant a node that writes receives (its storage), and
    everything computed from one."""
    written: set[int] = set()
    for node in gm.graph.nodes:
        if node in values or node.op != "call_function":
            continue
        facts = operator_facts(node.target)
        if node.target is operator.getitem or (facts is not None and not facts.writes):
            continue
        for source in node.all_input_nodes:
            if source in values:
                written |= storages(values[source])
    if not written:
        return
    for node in list(values):  # graph order: a node's inputs are judged before it
        tainted = bool(storages(values[node]) & written)
        if tainted or any(n not in values for n in constant_inputs(node)):
            del values[node]
            if node.op != "get_attr":
                skips.add(WRITTEN)


def _contiguous(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.contiguous()
    return tuple(t.contiguous() for t in tensors(value)) if isinstance(value, tuple) else value


class FoldConstantSubgraphs(FxPass):
    """Replace each output of an input-independent subgraph with a buffer computed once."""

    optimization = MobileOptimizerType.FOLD_CONSTANT_SUBGRAPHS
    summary: ClassVar[str] = "f(self.w, arange(n), x.new_zeros(...)) -> self._folded_i (once)"

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        skips = Skips()
        values, held = evaluate(gm, skips)
        drop_written(gm, values, skips)
        held = [n for n in held if n in values]
        outputs = _choose_outputs(gm, values, skips)
        if not outputs:
            return PassResult(gm, 0, dict(skips))
        for assertion in held:  # checked on the constants: they hold on every call
            gm.graph.erase_node(assertion)
            del values[assertion]
        copies: list[tuple[torch.Tensor, str]] = []
        for node in outputs:
            _replace_with_attributes(gm, node, _contiguous(values[node]), copies)
        _erase_dead(gm, outputs, values)
        erase_unused_attributes(gm)
        return PassResult(gm, len(outputs), dict(skips))
