"""Structural checks of the CPU TorchScript stage: what the pass tables (docs/pages/passes.md)
promise about the frozen, rewritten ``forward`` that ``fxmobile.optimize(..., backend="CPU")``
returns.

- no BatchNorm on running statistics is left: the FX stage folds it into its producer or
  decomposes it into ``x * s + t`` (one that normalizes by batch statistics stays, and so does
  one whose module keeps an untraceable hook: no rewrite crosses a hooked module);
- no dropout is left (every eval-mode dropout, and any with ``p=0``, is the identity);
- no ``aten::conv2d``, ``aten::conv_transpose2d`` or ``aten::linear`` with a constant weight is
  left unpacked, except a conv with string padding, and in a method that writes through
  ``as_strided`` or a reshape, flatten or view (a prepacked op may return other strides); an
  ``aten::conv1d`` stays only where the conv1d -> conv2d rewrite declines (a method that writes
  in place, or has a conv1d with string padding);
- a clamping activation that alone reads a prepacked run, whose packed context no other run
  shares and has no bounds yet, is fused into it (``fuse_clamp``).

The reasons come from the docs, never from the passes' own tables: the checks see what a
pass forgot to do.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from tests.fuzz.spec import Kind, ModelSpec

DROPOUT_KINDS = frozenset(
    f"aten::{name}{suffix}"
    for name in ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")
    for suffix in ("", "_")
)
PREPACKABLE = frozenset({"aten::conv2d", "aten::conv_transpose2d", "aten::linear"})
PREPACKED_RUNS = frozenset(
    {
        "prepacked::linear_clamp_run",
        "prepacked::conv2d_clamp_run",
        "prepacked::conv2d_transpose_clamp_run",
    }
)
# clamping activations and the inputs holding their (min, max) bounds; None: a fixed bound
CLAMPS: dict[str, tuple[int | None, int | None]] = {
    **dict.fromkeys(("aten::relu", "aten::relu_"), (None, None)),
    **dict.fromkeys(("aten::relu6", "aten::relu6_"), (None, None)),
    **dict.fromkeys(("aten::hardtanh", "aten::hardtanh_", "aten::clamp", "aten::clamp_"), (1, 2)),
    **dict.fromkeys(("aten::clamp_min", "aten::clamp_min_"), (1, None)),
    **dict.fromkeys(("aten::clamp_max", "aten::clamp_max_"), (None, 1)),
}
_NOT_CONSTANT = object()


def _constant(value: torch._C.Value) -> Any:
    node = value.node()
    return value.toIValue() if node.kind() == "prim::Constant" else _NOT_CONSTANT


def _nodes(module: torch.jit.ScriptModule, kinds: frozenset[str] | set[str]) -> list[Any]:
    graph: Any = module.graph  # torch's stubs omit Graph.findAllNodes
    return [n for kind in sorted(kinds) for n in graph.findAllNodes(kind)]


def _string_padding(node: torch._C.Node) -> bool:
    return isinstance(_constant(list(node.inputs())[4]), str)


def _constant_weight(node: torch._C.Node) -> bool:
    return isinstance(_constant(list(node.inputs())[1]), torch.Tensor)


def _clamp_bounds_constant(node: torch._C.Node) -> bool:
    """Both bounds are constant numbers (or fixed by the op) and do not cross."""
    inputs = list(node.inputs())
    bounds = []
    for index in CLAMPS[node.kind()]:
        if index is None:
            continue
        bound = _constant(inputs[index])
        if bound is _NOT_CONSTANT or isinstance(bound, torch.Tensor):
            return False
        bounds.append(bound)
    lo_hi = [b for b in bounds if b is not None]
    return not (len(lo_hi) == 2 and node.kind().startswith(("aten::hardtanh", "aten::clamp"))
                and lo_hi[0] > lo_hi[1])  # fmt: skip


def _context_name(run: torch._C.Node) -> str | None:
    source = run.inputsAt(1).node()
    return source.s("name") if source.kind() == "prim::GetAttr" else None


def _context_bounds(module: torch.jit.ScriptModule, name: str) -> tuple[Any, Any]:
    """(output_min, output_max) stored in a packed context: the last two items of its state."""
    state = getattr(module, name).__getstate__()
    fields = state[0] if isinstance(state, tuple) and isinstance(state[0], tuple) else state
    return fields[-2], fields[-1]


def missed_clamp_fusions(module: torch.jit.ScriptModule) -> list[str]:
    """Clamping activations ``fuse_clamp`` should have taken into the run before them."""
    runs = _nodes(module, PREPACKED_RUNS)
    contexts = Counter(_context_name(r) for r in runs)
    missed = []
    for clamp in _nodes(module, set(CLAMPS)):
        producer = clamp.inputsAt(0).node()
        if producer.kind() not in PREPACKED_RUNS or len(producer.output().uses()) != 1:
            continue
        name = _context_name(producer)
        if name is None or contexts[name] != 1 or not _clamp_bounds_constant(clamp):
            continue
        if _context_bounds(module, name) == (None, None):
            missed.append(f"{clamp.kind()} after {producer.kind()}")
    return missed


def check_script_structure(
    spec: ModelSpec,
    module: torch.jit.ScriptModule,
    allowed_running_bns: int,
    needed_batch_stats: int,
) -> None:
    """The frozen CPU module's ``forward`` shows what the pass tables (docs/pages/passes.md)
    promise.

    ``allowed_running_bns``: BatchNorm calls on running statistics that may stay (their module
    keeps a hook); ``needed_batch_stats``: BatchNorm calls on batch statistics the outputs need.
    """
    running = batch_stats = 0
    for node in _nodes(module, {"aten::batch_norm"}):
        training = _constant(list(node.inputs())[5])
        batch_stats += training is True
        running += training is not True
    assert running <= allowed_running_bns, (
        f"{running} BatchNorm calls on running statistics left in the CPU module (at most "
        f"{allowed_running_bns} may stay): the FX stage folds or decomposes every one"
    )
    assert batch_stats >= needed_batch_stats, (
        f"{needed_batch_stats} BatchNorm calls that the outputs need normalize by batch "
        f"statistics in eager, {batch_stats} in the CPU module (they must be left alone)"
    )
    dropouts = [n.kind() for n in _nodes(module, DROPOUT_KINDS)]
    assert not dropouts, f"dropout left in the CPU module: {dropouts}"
    unpacked = [
        n.kind()
        for n in _nodes(module, PREPACKABLE)
        if _constant_weight(n) and (n.kind() == "aten::linear" or not _string_padding(n))
    ]
    # a branch on is_contiguous() reads the strides a prepacked op may change: the method keeps
    # ATen's convolutions (fxmobile.script.aliasing's STRIDES_READ), as it does for as_strided
    reads_strides = any(b.kind is Kind.BRANCH and b.options["on"] == "layout" for b in spec.blocks)
    if not spec.reads_memory_order() and not reads_strides:
        assert not unpacked, f"ops with constant weights left unpacked: {unpacked}"
    # the rewrite declines a method that writes in place, or has a conv1d with string padding
    # (torch's pass would rewrite every conv1d of the method, and breaks those)
    conv1d = _nodes(module, {"aten::conv1d"})
    if not spec.writes_in_place() and not any(_string_padding(n) for n in conv1d):
        assert not conv1d, f"{len(conv1d)} aten::conv1d left (conv1d_to_conv2d declined?)"
    missed = missed_clamp_fusions(module)
    assert not missed, f"clamps not fused into the prepacked op before them: {missed}"
