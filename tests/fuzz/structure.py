"""Structural checks of the fuzz test: what the passes that ran promise about the graph.

Each check switches on when its pass shows in the report as run: no dropout left after
``remove_dropout``, a BN right after a conv / linear that only it reads folded, no running-stats
BN after ``decompose_batchnorm``, ``conv(x) * 2`` folded, a BN on batch statistics left alone,
and a module still called at several sites untouched (pytorch/pytorch#104593).
"""

from __future__ import annotations

import inspect
import math
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

import fxmobile
from fxmobile.capture.hooks import COMPILED, KEPT, RUN_BY_TRACE, TRACED
from fxmobile.report.records import Stage as RecordStage
from fxmobile.report.records import Status
from tests.fuzz.build import FuzzModel
from tests.fuzz.spec import IN_PLACE_HOOKS, PRODUCERS, PURE_HOOKS, Block, Kind, ModelSpec, attr_base
from tests.helpers import count_modules

DROPOUT_MODULE_TYPES = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)
# functional dropout -> (position, keyword, default) of its training flag
DROPOUT_TRAINING_ARG: dict[Any, tuple[int, str, bool]] = {
    F.dropout: (2, "training", True),
    F.dropout1d: (2, "training", True),
    F.dropout2d: (2, "training", True),
    F.dropout3d: (2, "training", True),
    F.alpha_dropout: (2, "training", False),
    F.feature_alpha_dropout: (2, "training", False),
    torch.dropout: (2, "train", True),
    torch.feature_dropout: (2, "train", True),
}


def _is_identity_dropout(node: fx.Node) -> bool:
    """A functional dropout that returns its input: ``training=False``, or ``p=0``."""
    if node.op != "call_function" or node.target not in DROPOUT_TRAINING_ARG:
        return False
    p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
    if p == 0:
        return True
    position, keyword, default = DROPOUT_TRAINING_ARG[node.target]
    if len(node.args) > position:
        return node.args[position] is False
    return node.kwargs.get(keyword, default) is False


def batchnorm_sites(gm: fx.GraphModule) -> tuple[int, int]:
    """(BN calls with running stats, BN calls normalizing by batch statistics) in ``gm``."""
    running = batch_stats = 0
    for node in gm.graph.nodes:
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                running += module.running_mean is not None
                batch_stats += module.running_mean is None
        elif node.op == "call_function" and node.target is F.batch_norm:
            mean = node.args[1] if len(node.args) > 1 else node.kwargs.get("running_mean")
            running += mean is not None
            batch_stats += mean is None
    return running, batch_stats


def _has_running_stats(block: Block) -> bool:
    if block.form == "module":
        return bool(block.options["track_running_stats"])
    return block.form != "function_batch_stats"


def foldable_into_producer(spec: ModelSpec, block: Block) -> bool:
    """A running-stats BN whose input is a conv / transposed conv / linear that only it reads,
    with the channels on dim 1 (a Linear's features are dim 1 only for a 2-D input), neither
    written as a subclass doing extra work nor hooked (a traced hook's work may sit between
    them, and no rewrite crosses a hook kept with its module)."""
    if block.kind is not Kind.BATCHNORM or not _has_running_stats(block) or block.src == 0:
        return False
    producer = spec.blocks[block.src - 1]
    if producer.kind not in PRODUCERS or spec.references()[block.src] != 1:
        return False
    if any(b.hooks or b.options.get("subclass") for b in (producer, block)):
        return False
    return producer.kind is not Kind.LINEAR or spec.values()[producer.src].dims == 0


def kept_hook_sites(spec: ModelSpec, kind: Kind | None = None) -> int:
    """Calls of modules (of ``kind``) whose hooks the hook rule (docs/pages/capture.md#hooks)
    says stay with them."""
    return sum(b.kept_hooks for b in spec.blocks if kind is None or b.kind is kind)


def live_values(spec: ModelSpec) -> set[int]:
    """The values the outputs are computed from (following data edges only: a dead block may
    go, even if it wrote in place to a live value, so this is a lower bound)."""
    live = set(spec.outputs)
    for i in reversed(range(len(spec.blocks))):
        block = spec.blocks[i]
        if i + 1 in live:
            live.update(k for k in (block.src, block.other) if k is not None)
    return live


def needed_batch_stats(spec: ModelSpec) -> int:
    """BN calls on batch statistics that the outputs are computed from. A repeated call of the
    same BN on the same value is one computation when nothing writes in place between the two
    calls (a block, or a hook of a block, from the first call on): TorchScript's
    common-subexpression pass keeps one (long profile, script-cpu: not a bug)."""
    live = live_values(spec)
    first: dict[tuple[int, int], int] = {}
    needed = 0
    for i, b in enumerate(spec.blocks):
        if i + 1 not in live or b.kind is not Kind.BATCHNORM or _has_running_stats(b):
            continue
        key = (b.src, b.owner if b.owner is not None else i)
        if key in first and not any(_writes(c) for c in spec.blocks[first[key] : i]):
            continue
        first.setdefault(key, i)
        needed += 1
    return needed


def _writes(block: Block) -> bool:
    """Whether running ``block`` (its hooks included) writes a tensor in place."""
    return block.inplace or any(h.name in IN_PLACE_HOOKS for h in block.hooks)


def ran(report: fxmobile.Report, name: str) -> bool:
    return any(
        p.name == name and p.stage is RecordStage.FX and p.status is Status.RAN
        for p in report.passes
    )


def shared_paths(spec: ModelSpec) -> set[str]:
    """Attribute names of the modules / tensors the program uses at several call sites."""
    calls = [0] * len(spec.blocks)
    for i, block in enumerate(spec.blocks):
        calls[block.owner if block.owner is not None else i] += 1
    paths: set[str] = set()
    for i, block in enumerate(spec.blocks):
        if block.options.get("parametrize"):
            continue  # baked into a plain weight: its state differs on purpose
        if calls[block.owner if block.owner is not None else i] > 1:
            base = attr_base(i, block)
            paths.update((base, f"{base}_weight", f"{base}_bias"))
    return paths


def assert_shared_untouched(spec: ModelSpec, model: FuzzModel, gm: fx.GraphModule) -> None:
    """A module (or weight) still called at several sites of the optimized graph computes what
    the original did: a fold into one site must go to a new module (pytorch/pytorch#104593).
    One that is left with a single call site may have been replaced at its path: that is fine."""
    sites: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op in ("call_module", "get_attr"):
            sites[str(node.target)] = sites.get(str(node.target), 0) + 1
    for path in shared_paths(spec):
        if sites.get(path, 0) < 2 or not hasattr(model, path):
            continue
        then, now = getattr(model, path), getattr(gm, path)
        if isinstance(then, nn.Module):
            then, now = then.state_dict(), now.state_dict()
        else:
            then, now = {path: then}, {path: now}
        same = then.keys() == now.keys() and all(torch.equal(then[k], now[k]) for k in then)
        assert same, (
            f"{path} is called at {sites[path]} sites of the optimized graph and no longer "
            f"holds the original tensors (rewritten in place? pytorch/pytorch#104593)"
        )


_PRODUCER_MODULES = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
    nn.Linear,
)  # fmt: skip
_PRODUCER_FUNCTIONS = (
    F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d,
    F.linear,
)  # fmt: skip
# y (op) c with a Python number c, in every spelling, as fold_conv_arithmetic documents it
_SCALAR_OPS: dict[Any, str] = {
    **dict.fromkeys((operator.add, torch.add, "add"), "add"),
    **dict.fromkeys((operator.sub, torch.sub, "sub"), "sub"),
    **dict.fromkeys((operator.mul, torch.mul, "mul"), "mul"),
    **dict.fromkeys((operator.truediv, torch.div, "div"), "div"),
}


def _is_producer(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A conv / linear call a constant may fold into (not a module kept with its hooks)."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        hooked = module._forward_hooks or module._forward_pre_hooks
        return type(module) in _PRODUCER_MODULES and not hooked
    if node.op != "call_function" or node.target not in _PRODUCER_FUNCTIONS:
        return False
    weights = [a for a in node.args[1:3] if isinstance(a, fx.Node)]
    return bool(weights) and all(a.op == "get_attr" for a in weights)


def missed_scalar_folds(gm: fx.GraphModule) -> list[str]:
    """``conv(x) * 2``-style nodes left: a producer read only by an add/sub/mul/div with a
    finite Python number (non-zero to divide by; ``c - y`` and ``c / y`` do not count)."""
    missed = []
    for node in gm.graph.nodes:
        if not _is_producer(gm, node) or len(node.users) != 1:
            continue
        (user,) = node.users
        key = user.target if user.op in ("call_function", "call_method") else None
        if key not in _SCALAR_OPS or len(user.args) != 2 or set(user.kwargs) - {"alpha"}:
            continue
        op, (a, b) = _SCALAR_OPS[key], user.args
        c = b if a is node else a
        if type(c) not in (int, float) or not math.isfinite(c) or (op == "div" and c == 0):
            continue
        if a is not node and op in ("sub", "div"):
            continue
        if type(user.kwargs.get("alpha", 1)) in (int, float):
            missed.append(user.format_node())
    return missed


def check_structure(
    spec: ModelSpec, model: FuzzModel, gm: fx.GraphModule, report: fxmobile.Report
) -> None:
    blocks, refs = spec.blocks, spec.references()
    if ran(report, "remove_dropout"):
        left = sum(count_modules(gm, kind) for kind in DROPOUT_MODULE_TYPES)
        assert left == 0, f"{left} dropout module call(s) left after remove_dropout"
        left = sum(_is_identity_dropout(n) for n in gm.graph.nodes)
        assert left == 0, f"{left} functional dropout(s) with training=False or p=0 left"
    running, batch_stats = batchnorm_sites(gm)
    bns = [b for b in blocks if b.kind is Kind.BATCHNORM]
    needed = needed_batch_stats(spec)
    assert batch_stats >= needed, (
        f"{needed} BN calls that the outputs need normalize by batch statistics in eager, "
        f"{batch_stats} after optimizing (they must be left alone, pytorch/pytorch#71259)"
    )
    if ran(report, "fold_batchnorm"):
        must_fold = sum(foldable_into_producer(spec, b) for b in blocks)
        total = sum(_has_running_stats(b) for b in bns)
        assert running <= total - must_fold, (
            f"{running} running-stats BN calls left of {total}: at least {must_fold} follow a "
            f"conv / linear that only they read and must have folded"
        )
    if ran(report, "decompose_batchnorm"):
        kept = kept_hook_sites(spec, Kind.BATCHNORM)  # no rewrite crosses a kept hook
        assert running <= kept, (
            f"{running} running-stats BN calls left after decompose_batchnorm ({kept} keep hooks)"
        )
    if ran(report, "fold_conv_arithmetic"):
        # y (op) number where y has other readers in the program may stay (those readers may
        # be dead code that goes only after folding): every other one must have folded
        may_stay = sum(
            b.kind is Kind.ARITHMETIC and b.options["const"] == "scalar" and refs[b.src] > 1
            for b in blocks
        )
        # a copy (y = v - 0) that a view write then writes: folding it would write the conv
        may_stay += sum(
            b.kind is Kind.VIEW_WRITE and b.options["copy"] in ("add0", "sub0", "mul1", "div1")
            for b in blocks
        )
        # a traced pre-hook's arithmetic on the module's input, another reader of that value
        may_stay += sum(
            h.name in ("pre_scale", "pre_kwargs_shift") and refs[b.src] > 1
            for b in blocks
            for h in b.hooks
        )
        missed = missed_scalar_folds(gm)
        assert len(missed) <= may_stay, (
            f"constant arithmetic on a conv / linear output not folded: {missed}"
        )
    hooked = sum(
        n.op == "call_module" and bool(_hooks(gm.get_submodule(str(n.target))))
        for n in gm.graph.nodes
    )
    kept = kept_hook_sites(spec)
    assert hooked == kept, (
        f"{hooked} calls of modules with hooks in the optimized graph, {kept} in the program "
        f"keep theirs (docs/pages/capture.md#hooks: any hook that is not a plain pure function "
        f"stays with its module; "
        f"a traced one is not run again)"
    )
    assert_shared_untouched(spec, model, gm)


def _hooks(module: nn.Module) -> list[Any]:
    return [*module._forward_pre_hooks.values(), *module._forward_hooks.values()]


def traced_by_readme(hook: Any) -> bool:
    """The hook rule (docs/pages/capture.md#hooks), for the fuzzer's hooks: its pure plain
    functions are traced."""
    return inspect.isfunction(hook) and hook.__name__ in PURE_HOOKS


def check_hook_report(model: nn.Module, report: fxmobile.Report) -> None:
    """The report says, for every hooked module of the caller's model, that its hooks were
    traced into the graph when all are plain pure functions, and kept with it otherwise; on a
    TorchScript fallback route, that each ran in torch.jit.trace or was compiled by
    torch.jit.script (docs/pages/capture.md#hooks)."""
    expected: dict[str, bool] = {}
    for path, module in model.named_modules():
        hooks = [h for h in _hooks(module) if not isinstance(h, WeightNorm | SpectralNorm)]
        if hooks:
            expected[path] = all(traced_by_readme(h) for h in hooks)
    forward_kinds = ("forward hook", "forward pre-hook")
    records = [r for r in report.hooks if r.kind.startswith(forward_kinds)]
    fallback = {"torch.jit.trace": RUN_BY_TRACE, "torch.jit.script": COMPILED}.get(
        report.route or ""
    )
    if fallback is not None:
        # the fallback runs the model as it is: old-API weight_norm's pre-hooks are listed too
        norms = {"WeightNorm", "SpectralNorm"}
        listed = {r.module for r in records if r.hook not in norms}
        assert all(r.action.startswith(fallback) for r in records), records
        assert listed == set(expected), (
            f"hooked modules on the {report.route} route: the report lists {sorted(listed)}, "
            f"the model has {sorted(expected)}"
        )
        return
    seen: dict[str, bool] = {}
    for record in records:
        traced = record.action.startswith(TRACED)
        assert traced or record.action.startswith(KEPT), record
        seen[record.module] = seen.get(record.module, True) and traced
    assert seen == expected, (
        f"hooked modules traced (True) or kept (False): the report says {seen}, the hook "
        f"rule {expected}"
    )
