"""Differential fuzzing: fxmobile's optimized model against eager, on random valid models.

Every model ``tests.fuzz.models.model_specs()`` draws goes through each available stage
(``optimize_fx``; ``optimize_fx(..., channels_last=True)`` when that adds a pass;
``fxmobile.optimize(..., backend="CPU")``, both stages, when it exists) and must:

- compute what eager computes, in eager's dtype, within the rounding bound of
  ``assert_close_to_anchor`` (float64 anchor);
- compute the same on a second call, and do to its input what eager does (in-place ops);
- show the structure its FX passes promise: no dropout left, a BN that normalizes by batch
  statistics left alone, a BN right after a conv / linear that only it reads folded, a
  ``conv(x) * 2`` folded, a module still called at several sites untouched (each check
  switches on when its pass shows in the report);
- leave the caller's model and example inputs exactly as they were and share no storage
  with the model;
- or refuse with an ``FxMobileError`` that names the problem. A ``PassError`` (a pass crashed),
  a ``NumericsError`` and any other exception are failures.

Profiles: ``make test`` runs 500 models per stage, derandomized (the same models every run).
``FXMOBILE_FUZZ_EXAMPLES=20000`` (``make fuzz-long``) runs that many, with a fresh random seed
each run; a failure prints its ``@reproduce_failure`` blob and the minimal program, and
``--hypothesis-seed=N`` repeats a run. Every failure found becomes a ``test_regression_*`` below.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import math
import operator
import os
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, event, given, settings
from torch import fx, nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

import fxmobile
from fxmobile.backends.library import ExtensionUnavailableError
from fxmobile.backends.xnnpack.fuse_add_relu import ALIASED, MIXED_DTYPES, READ_ELSEWHERE
from fxmobile.passes.pipeline import fx_pipeline
from fxmobile.report.records import PassRecord, Status
from fxmobile.report.records import Stage as RecordStage
from tests.fuzz.models import (
    PRODUCERS,
    Block,
    FuzzModel,
    Kind,
    Layout,
    ModelSpec,
    Value,
    attr_base,
    build,
    example_input,
    model_specs,
)
from tests.helpers import assert_equivalent, count_modules
from tests.test_no_mutation import (
    ModelSnapshot,
    assert_outputs_identical,
    assert_shares_no_storage,
)

DEFAULT_EXAMPLES = 500
EXAMPLES = int(os.environ.get("FXMOBILE_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=EXAMPLES <= DEFAULT_EXAMPLES,
    database=None,
    deadline=None,
    print_blob=True,
    # models are drawn block by block from the shapes; a draw is large and slow by design
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Stage(enum.Enum):
    FX = "fx"  # optimize_fx
    FX_CHANNELS_LAST = "fx-channels-last"  # optimize_fx(..., channels_last=True)
    SCRIPT_CPU = "script-cpu"  # optimize(..., backend="CPU"): both stages


HAS_SCRIPT_STAGE = hasattr(fxmobile, "optimize")
HAS_CHANNELS_LAST = any(
    p.optimization is fxmobile.MobileOptimizerType.CHANNELS_LAST
    for p in fx_pipeline(channels_last=True)
)
STAGES = [
    pytest.param(Stage.FX, id="fx"),
    pytest.param(
        Stage.FX_CHANNELS_LAST,
        id="fx-channels-last",
        marks=pytest.mark.skipif(
            not HAS_CHANNELS_LAST,
            reason="optimize_fx(channels_last=True) adds no pass yet (fx_pipeline ignores it)",
        ),
    ),
    pytest.param(
        Stage.SCRIPT_CPU,
        id="script-cpu",
        marks=pytest.mark.skipif(
            not HAS_SCRIPT_STAGE,
            reason="fxmobile.optimize (the TorchScript stage) is not exported yet: only the FX "
            "stage is fuzzed",
        ),
    ),
]

# An FxMobileError that is not a refusal: a crash in a pass, a missing operator library, or the
# optimizer's own numerical check catching a miscomputation.
NOT_REFUSALS: tuple[type[Exception], ...] = (
    fxmobile.PassError,
    fxmobile.NumericalMismatchError,
    ExtensionUnavailableError,
)


def optimize(stage: Stage, model: nn.Module, x: torch.Tensor) -> tuple[Any, fxmobile.Report]:
    if stage is not Stage.SCRIPT_CPU:
        result = fxmobile.optimize_fx(model, x, channels_last=stage is Stage.FX_CHANNELS_LAST)
        return result.graph_module, result.report
    mobile = fxmobile.optimize(model, example_inputs=x, backend="CPU")
    return mobile.module, mobile.report


def run(
    module: Callable[..., Any],
    spec: ModelSpec,
    dtype: torch.dtype | None = None,
    memory_format: torch.memory_format | None = None,
) -> Any:
    """``(outputs, input after the call)``: a fresh input each time (a forward may write to it;
    a clone would lose the strided layout), in ``dtype`` and ``memory_format`` when given."""
    x = example_input(spec)
    if dtype is not None:
        x = x.to(dtype)
    if memory_format is not None:
        x = x.contiguous(memory_format=memory_format)
    with torch.no_grad():
        return module(x), x


def leaves(outputs: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]


# ----------------------------------------------------------------------------- numerics

# float64 rounds 2**29 times finer than float32 (unit roundoff 2**-53 against 2**-24).
FLOAT64_PER_FLOAT32 = 2.0**-29
# Floors of the bound, relative to the output's scale, for when eager's own error is zero or
# small by luck (an exact model, a single output element): 1e-5 is about 80 float32 ulps of
# the largest output. The float64 floor is 4x that in float64 ulps: the long profile found
# ``BN(BN_batch_stats(x - x))`` in float64 at 90 ulps (2.0e-14 of the scale) while eager was
# exact by luck: batch statistics of a constant cancel, and the folded BN rounds elsewhere.
# Still ten orders of magnitude below what a bug does.
REL_FLOOR = {torch.float32: 1e-5, torch.float64: 4e-5 * FLOAT64_PER_FLOAT32}
TINY = 1e-30  # an output that is exactly zero must stay (about) zero
# An output that eager gets wrong by more than this fraction of its scale is mostly rounding
# noise (``v - v`` fed to a BN on batch statistics, say): the ratio of two rounding noises has a
# long tail there (4.6x seen), so it gets 32x eager's error instead of 4x. Such outputs are
# rare (none among the 3,236 measured below): the bound stays tight for every other one.
ILL_CONDITIONED = 1e-3


def assert_close_to_anchor(
    got: torch.Tensor, ref64: torch.Tensor, noise: float, dtype: torch.dtype, where: str
) -> None:
    """``|got - ref64| <= max(4 * noise, floor * scale) + tiny`` (32 * noise if ill-conditioned).

    ``ref64`` is the model run in float64; ``noise`` is how far rounding takes eager from
    there (``rounding_noise``: eager's own error, and how far eager moves when every parameter
    or every intermediate changes by one unit in the last place); ``dtype`` is eager's dtype
    for this result. The optimized model computes the same function with its rounding moved (a
    BN folded into a conv rounds ``W * s`` once, a decomposed BN rounds ``x * s + t`` instead
    of ``(x - mean) / sqrt(var + eps)``): its error goes through the same amplification
    (cancellation after a BN, division by a small constant) as those nudges, so a few times the
    noise covers it. The floor covers the outputs where all of them are small by luck. Measured
    on the 1,355 outputs of the default profile (500 models per stage) with a nonzero error:
    the optimized error reached 1.16x the noise (99th percentile 0.87x, median 0.24x). A bug (a
    lost bias, a wrong weight axis, a corrupted shared conv) is off by a sizeable fraction of
    the output's scale: orders of magnitude beyond the bound.
    """
    assert got.shape == ref64.shape, f"{where}: shape {tuple(got.shape)} != {tuple(ref64.shape)}"
    if not ref64.numel():
        return
    err = float((got.double() - ref64).abs().max())
    scale = float(ref64.abs().max())
    factor = 32 if noise > ILL_CONDITIONED * scale else 4
    bound = max(factor * noise, REL_FLOOR[dtype] * scale) + TINY
    assert err <= bound, (
        f"{where}: max abs error {err:.3g} against the float64 anchor exceeds {bound:.3g} "
        f"(rounding noise {noise:.3g}, output scale {scale:.3g})"
    )


def in_dtype(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy with every floating tensor in ``dtype``, plain tensor attributes included
    (``Module.to`` converts only parameters and buffers)."""
    copied = copy.deepcopy(model).to(dtype)
    for sub in copied.modules():
        for name, value in list(vars(sub).items()):
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                object.__setattr__(sub, name, value.to(dtype))
    return copied


def results(
    module: Callable[..., Any],
    spec: ModelSpec,
    dtype: torch.dtype | None = None,
    memory_format: torch.memory_format | None = None,
) -> Any:
    """The tensors a call produces: its outputs, and its input after the call (a forward that
    writes to its input in place computes values into it, like an output)."""
    outputs, written_input = run(module, spec, dtype, memory_format)
    return [*leaves(outputs), written_input]


def other_layout(spec: ModelSpec) -> torch.memory_format | None:
    """The layout the optimized model may switch a 4-D or 5-D input to (or back from); None
    when the model writes in place and flattens, where the layout changes more than rounding
    (a write through ``flatten`` of a channels-last tensor lands on a copy)."""
    channels_last = {2: torch.channels_last, 3: torch.channels_last_3d}.get(spec.input.dims)
    if channels_last is None or spec.input.extra_dim:
        return None
    if any(b.inplace for b in spec.blocks) and any(b.kind is Kind.FLATTEN for b in spec.blocks):
        return None
    return torch.contiguous_format if spec.layout is Layout.CHANNELS_LAST else channels_last


def rounding_noise(
    model: nn.Module, spec: ModelSpec, eager: list[torch.Tensor], ref64: list[torch.Tensor]
) -> list[float]:
    """Per result, how far rounding takes eager from the float64 anchor: the largest of

    - eager's own distance; for a float64 result (a float64 model, or a float32 one that a
      float64 constant promoted) at least 2**-29 of an all-float32 copy's distance: where
      eager computes in float64 all along it *is* the anchor, and the float32 copy measures
      the amplification its float64 rounding goes through;
    - how far eager moves when every parameter, or every intermediate result, moves by one
      unit in the last place, or when its input comes in the other memory layout: the
      rounding that folding, fusing and a channels-last rewrite may change.
    """
    copy32 = None
    if any(e.dtype is torch.float64 for e in eager):
        copy32 = results(in_dtype(model, torch.float32), spec, torch.float32)
    nudged = results(nudged_copy(model, spec.seed), spec)
    jittered_model = copy.deepcopy(model)
    with RoundingJitter(spec.seed):
        jittered = results(jittered_model, spec)
    layout = other_layout(spec)
    relaid = None if layout is None else results(model, spec, memory_format=layout)
    noise = []
    for i, (e, r) in enumerate(zip(eager, ref64, strict=True)):
        if not r.numel():
            noise.append(0.0)
            continue
        n = float((e.double() - r).abs().max())
        if copy32 is not None and e.dtype is torch.float64:
            n = max(n, FLOAT64_PER_FLOAT32 * float((copy32[i].double() - r).abs().max()))
        # A fold rounds the parameters differently: the output's sensitivity to a last-bit
        # change of every parameter is rounding a correct optimization may add. It shows where
        # eager is exact by luck (batch statistics of a constant divide that last bit by
        # sqrt(eps): found by the long profile).
        n = max(n, float((nudged[i].double() - e.double()).abs().max()))
        # Folding and fusing also move where each operation rounds: the output's sensitivity
        # to a last-bit change of every intermediate is that rounding. It shows where a
        # normalization by batch statistics amplifies what eager happened to round alike
        # (found by the long profile: 18x eager's own error, 1e-5 of the scale).
        n = max(n, float((jittered[i].double() - e.double()).abs().max()))
        # A channels-last input changes the order in which batch statistics are summed (found
        # by the long profile: 5x the other measures, a BN on batch statistics of clamped
        # values); the CPU stage makes that change.
        if relaid is not None:
            n = max(n, float((relaid[i].double() - e.double()).abs().max()))
        noise.append(n)
    return noise


def nudged_copy(model: nn.Module, seed: int) -> nn.Module:
    """A copy whose every floating tensor (parameters, buffers, plain tensor attributes) is
    moved by one unit in the last place, up or down at random."""
    copied = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for sub in copied.modules():
            for value in list(vars(sub).values()):  # _parameters, _buffers, plain attributes
                tensors = value.values() if isinstance(value, dict) else [value]
                for t in tensors:
                    if isinstance(t, torch.Tensor) and t.is_floating_point():
                        ulp = torch.finfo(t.dtype).eps
                        signs = torch.randint(0, 2, t.shape, generator=generator) * 2 - 1
                        t.mul_(1 + ulp * signs.to(t.dtype))
    return copied


class RoundingJitter(TorchFunctionMode):
    """Moves every floating tensor an operation computes by one unit in the last place, up or
    down at random: the model computed with each operation rounding differently.

    A result written in place (``relu_``, ``F.hardtanh(x, inplace=True)``: its version counter
    moved) is moved in place. A result that otherwise shares storage with an argument (a view,
    ``.data``, ``x.contiguous()`` of a contiguous ``x``) computed nothing and is left alone, so
    what the model writes and shares stays as eager has it.
    """

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        versions = [t._version for t in tensors]
        out = func(*args, **(kwargs or {}))
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        written = any(out is t and t._version != v for t, v in zip(tensors, versions, strict=True))
        storage = out.untyped_storage().data_ptr()
        if written or all(t.untyped_storage().data_ptr() != storage for t in tensors):
            ulp = torch.finfo(out.dtype).eps
            signs = torch.randint(0, 2, out.shape, generator=self.generator) * 2 - 1
            # elements that share memory (an expanded tensor) cannot be written one by one
            with torch.no_grad(), contextlib.suppress(RuntimeError):
                out.mul_(1 + ulp * signs.to(out.dtype))
        return out


def assert_acts_like_eager(
    model: nn.Module, optimized: Callable[..., Any], x: torch.Tensor, *, exact: bool = False
) -> None:
    """On clones of ``x``, ``optimized`` returns what ``model`` returns (bit for bit when
    ``exact``) and leaves its input as eager does (a write to it kept, none added)."""
    expected_input, got_input = x.clone(), x.clone()
    with torch.no_grad():
        expected, got = leaves(model(expected_input)), leaves(optimized(got_input))
    tolerance = {"rtol": 0.0, "atol": 0.0} if exact else {}
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, **tolerance)
    assert torch.equal(got_input, expected_input), "the input after the call differs from eager's"


# ----------------------------------------------------------------------------- structure

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
    with the channels on dim 1 (a Linear's features are dim 1 only for a 2-D input)."""
    if block.kind is not Kind.BATCHNORM or not _has_running_stats(block) or block.src == 0:
        return False
    producer = spec.blocks[block.src - 1]
    if producer.kind not in PRODUCERS or spec.references()[block.src] != 1:
        return False
    return producer.kind is not Kind.LINEAR or spec.values()[producer.src].dims == 0


def live_values(spec: ModelSpec) -> set[int]:
    """The values the outputs are computed from (following data edges only: a dead block may
    go, even if it wrote in place to a live value, so this is a lower bound)."""
    live = set(spec.outputs)
    for i in reversed(range(len(spec.blocks))):
        block = spec.blocks[i]
        if i + 1 in live:
            live.update(k for k in (block.src, block.other) if k is not None)
    return live


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
    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target))) in _PRODUCER_MODULES
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
    live = live_values(spec)
    needed = sum(
        not _has_running_stats(b) for i, b in enumerate(blocks) if i + 1 in live and b in bns
    )
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
        assert running == 0, f"{running} running-stats BN calls left after decompose_batchnorm"
    if ran(report, "fold_conv_arithmetic"):
        # y (op) number where y has other readers in the program may stay (those readers may
        # be dead code that goes only after folding): every other one must have folded
        may_stay = sum(
            b.kind is Kind.ARITHMETIC and b.options["const"] == "scalar" and refs[b.src] > 1
            for b in blocks
        )
        missed = missed_scalar_folds(gm)
        assert len(missed) <= may_stay, (
            f"constant arithmetic on a conv / linear output not folded: {missed}"
        )
    assert_shared_untouched(spec, model, gm)


# ----------------------------------------------------------------------------- the fuzz test


def report_coverage(spec: ModelSpec) -> None:
    """Hypothesis events (``--hypothesis-show-statistics``): which hazards the models had."""
    refs = spec.references()
    event(f"input: {spec.input.dims}-D {spec.layout.value} {spec.input.dtype}")
    for i, b in enumerate(spec.blocks):
        event(f"block: {b.kind.value}")
        if b.owner is not None:
            event("module or weights called at several sites")
        if b.inplace:
            event("in-place op")
        if refs[i + 1] > 1:
            event("value with several consumers")
        if foldable_into_producer(spec, b):
            event(f"BN right after {spec.blocks[b.src - 1].kind.value}, foldable")
        elif b.kind is Kind.BATCHNORM and not _has_running_stats(b):
            event("BN on batch statistics")
        if b.kind is Kind.ARITHMETIC and b.src and spec.blocks[b.src - 1].kind in PRODUCERS:
            event(f"constant {b.options['op']} after {spec.blocks[b.src - 1].kind.value}")


def check_model(stage: Stage, spec: ModelSpec) -> str | None:
    """Checks the model ``spec`` describes through ``stage``; the refusal's name if refused."""
    model = build(spec)
    snapshot = ModelSnapshot.take(model)
    eager = results(model, spec)
    ref64 = [t.double() for t in results(in_dtype(model, torch.float64), spec, torch.float64)]
    assume(all(bool(t.isfinite().all()) for t in [*eager, *ref64]))
    noise = rounding_noise(model, spec, eager, ref64)
    given_input = example_input(spec)
    try:
        optimized, report = optimize(stage, model, given_input)
    except NOT_REFUSALS:
        raise
    except fxmobile.FxMobileError as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
        snapshot.assert_unchanged(model)
        return type(exc).__name__
    snapshot.assert_unchanged(model)
    assert torch.equal(given_input, example_input(spec)), "optimizing wrote to example_inputs"
    assert_outputs_identical(eager, results(model, spec))
    assert_shares_no_storage(optimized, model)

    got = results(optimized, spec)
    assert len(got) == len(ref64), "the optimized model returns a different structure"
    for i, (g, e, r, n) in enumerate(zip(got, eager, ref64, noise, strict=True)):
        # the last result is what the call left in its input (eager may write to it)
        where = "the input after the call" if i == len(got) - 1 else f"output {i}"
        assert g.dtype == e.dtype, f"{where} is {g.dtype}, eager's {e.dtype} (pytorch#76578)"
        assert_close_to_anchor(g, r, n, e.dtype, where)
    for i, (a, g) in enumerate(zip(results(optimized, spec), got, strict=True)):
        assert torch.equal(a, g), f"result {i} differs on a second call (pytorch/pytorch#52463)"
    if stage is not Stage.SCRIPT_CPU:
        check_structure(spec, model, optimized, report)
    return None


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@FUZZ
@given(spec=model_specs())
def test_optimized_model_matches_eager(stage: Stage, spec: ModelSpec) -> None:
    report_coverage(spec)
    refusal = check_model(stage, spec)
    if refusal:
        event(f"refused: {refusal}")


# ----------------------------------------------------------------------------- the oracle itself


def test_bound_tells_rounding_from_a_bug() -> None:
    """A BN folded with its bias dropped fails the bound; eager's own rounding passes it."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, 6)
    conv, bn = nn.Conv2d(4, 5, 3, bias=False), nn.BatchNorm2d(5)
    model = nn.Sequential(conv, bn).eval()
    mean, var = torch.randn(5), torch.rand(5) + 0.5
    bn.running_mean, bn.running_var = mean.clone(), var.clone()
    with torch.no_grad():
        ref64 = copy.deepcopy(model).double()(x.double())
        eager = model(x)
        noise = float((eager.double() - ref64).abs().max())
        assert_close_to_anchor(eager, ref64, noise, torch.float32, "eager")
        s = bn.weight / torch.sqrt(var + bn.eps)
        folded = copy.deepcopy(conv)
        folded.weight.mul_(s.reshape(-1, 1, 1, 1))
        lost_bias = folded(x)  # W' folded, b' = beta - mean * s forgotten (pytorch#127227)
    with pytest.raises(AssertionError, match="exceeds"):
        assert_close_to_anchor(lost_bias, ref64, noise, torch.float32, "lost bias")


def _unit_stride_conv(out_channels: int, kernel: tuple[int, int], **extra: Any) -> dict[str, Any]:
    """Options of a stride-1, unpadded, ungrouped conv without bias, as the generator writes
    them (``extra``: dilation, padding_mode, output_padding)."""
    options = {"out_channels": out_channels, "kernel": kernel, "stride": (1, 1)}
    options |= {"padding": (0, 0), "dilation": extra.pop("dilation", (1, 1)), "groups": 1}
    return {**options, "bias": False, **extra}


def batch_statistics_after_a_bn_chain() -> ModelSpec:
    """The program the long profile shrank to: a 1x1 conv, a chain of BNs on running
    statistics (the function form called twice with the same tensors), then a BN on batch
    statistics with a small eps."""
    x = Value(5, (3, 8), torch.float32)
    bn = {"eps": 0.1, "affine": "parameter"}
    conv = _unit_stride_conv(5, (1, 1), padding_mode="zeros")
    blocks = (
        Block(Kind.CONV, "module", 0, x, conv),
        Block(Kind.BATCHNORM, "function", 1, x, bn),
        Block(Kind.ACTIVATION, "module", 2, x, {"op": "relu", "inplace": False}),
        Block(Kind.BATCHNORM, "function", 3, x, {**bn, "alias": False}, owner=1),
        Block(
            Kind.BATCHNORM,
            "module",
            4,
            x,
            {"eps": 0.1, "affine": False, "track_running_stats": True},
        ),
        Block(Kind.BATCHNORM, "function_batch_stats", 5, x, {"eps": 0.0004, "affine": "parameter"}),
    )
    return ModelSpec(x, 2, Layout.CONTIGUOUS, blocks, (6,), seed=0)


def batch_statistics_of_clamped_values() -> ModelSpec:
    """The long profile's third false alarm: a BN on batch statistics of clamped values."""
    x = Value(3, (5, 7), torch.float32)
    bn = {"eps": 0.1, "affine": False, "track_running_stats": True}
    relu = {"op": "relu", "inplace": False}
    up = _unit_stride_conv(1, (1, 1), output_padding=(0, 0))
    blocks = (
        Block(Kind.BATCHNORM, "module", 0, x, bn),
        Block(Kind.ACTIVATION, "module", 1, x, relu),
        Block(Kind.ACTIVATION, "module", 2, x, relu),
        Block(Kind.BATCHNORM, "module", 3, x, bn),
        Block(Kind.ACTIVATION, "module", 4, x, {**relu, "op": "hardtanh", "min": 0.0, "max": 1.4}),
        Block(Kind.BATCHNORM, "module", 5, x, {**bn, "eps": 0.013, "track_running_stats": False}),
        Block(Kind.CONV_TRANSPOSE, "module", 6, Value(1, (5, 7), torch.float32), up),
    )
    return ModelSpec(x, 2, Layout.CONTIGUOUS, blocks, (7,), seed=0)


def batch_statistics_of_a_clamp_in_place() -> ModelSpec:
    """The fourth: BNs on batch statistics around an in-place clamp to a narrow band, the
    same BN module called at three sites."""
    x = Value(1, (3, 5), torch.float32)
    y = Value(2, (3, 9), torch.float32)
    up = _unit_stride_conv(2, (1, 3), dilation=(1, 2), output_padding=(0, 0))
    bn = {"eps": 0.1, "affine": False, "track_running_stats": False}
    again = {**bn, "alias": False}
    clamp = {"op": "hardtanh", "inplace": True, "min": -0.75, "max": -0.7}
    blocks = (
        Block(Kind.CONV_TRANSPOSE, "module", 0, y, up),
        Block(Kind.BATCHNORM, "module", 1, y, bn),
        Block(Kind.BATCHNORM, "module", 2, y, again, owner=1),
        Block(Kind.ACTIVATION, "module", 3, y, clamp),
        Block(Kind.BATCHNORM, "module", 4, y, again, owner=1),
        Block(Kind.ACTIVATION, "module", 5, y, {"op": "relu", "inplace": False}),
    )
    return ModelSpec(x, 2, Layout.STRIDED, blocks, (6,), seed=0)


@pytest.mark.skipif(not HAS_SCRIPT_STAGE, reason="needs fxmobile.optimize")
@pytest.mark.parametrize(
    "program",
    [
        batch_statistics_after_a_bn_chain,
        batch_statistics_of_clamped_values,
        batch_statistics_of_a_clamp_in_place,
    ],
    ids=["rounded-alike-by-eager", "summed-in-another-order", "clamped-in-place"],
)
def test_regression_oracle_noise_covers_what_batch_statistics_amplify(
    program: Callable[[], ModelSpec],
) -> None:
    """A BN on batch statistics divides each element's rounding by the channel's spread. The
    long profile (one thread) flagged three correct models: a folded BN chain rounded each
    element differently from eager, which had rounded many alike (18x eager's own error, 1e-5
    of the scale), and the channels-last rewrite summed the batch statistics in another order
    (5x; 22x where an in-place clamp fed them). The noise now includes eager with every
    intermediate, in-place results too, nudged by one unit in the last place, and eager on a
    channels-last input."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the rounding that was seen, reduction order included
    try:
        assert check_model(Stage.SCRIPT_CPU, program()) is None
    finally:
        torch.set_num_threads(threads)


def test_rounding_jitter_moves_results_and_leaves_the_model_alone() -> None:
    """The jittered run differs from eager in the last bits only, never touches parameters,
    moves results written in place, and leaves views and no-op copies alone."""
    spec = batch_statistics_after_a_bn_chain()
    model = build(spec)
    snapshot = ModelSnapshot.take(model)
    eager = results(model, spec)
    with RoundingJitter(spec.seed):
        jittered = results(model, spec)
    snapshot.assert_unchanged(model)
    for e, j in zip(eager[:-1], jittered[:-1], strict=True):
        assert not torch.equal(e, j)
        torch.testing.assert_close(j, e, rtol=0, atol=1e-3 * float(e.abs().max()))
    x = torch.ones(3)
    with RoundingJitter(0):
        y = x.add_(1)
        v = x.view(3)
        c = x.contiguous()
        z = v * 1
    assert y is x and not torch.equal(x, torch.full((3,), 2.0)), "an in-place result stayed"
    moved = x.clone()
    assert torch.equal(v, moved) and torch.equal(c, moved), "a view or no-op copy moved"
    assert not torch.equal(z, moved), "a fresh result was not moved"


def test_structure_checks_see_what_did_not_happen() -> None:
    """Given the unoptimized graph and a report claiming the passes ran, every structural check
    fires: a BN after a conv it alone reads, a dropout module, ``conv(x) * 2``."""
    f32 = torch.float32
    x, y = Value(2, (4, 4), f32), Value(3, (4, 4), f32)
    conv = {"out_channels": 3, "kernel": (3, 3), "stride": (1, 1), "padding": (1, 1)}
    conv |= {"dilation": (1, 1), "groups": 1, "bias": False, "padding_mode": "zeros"}
    bn = {"eps": 1e-5, "affine": True, "track_running_stats": True}
    dropout = {"fn": "Dropout", "p": 0.5, "inplace": False}
    cases = {
        "fold_batchnorm": (Block(Kind.BATCHNORM, "module", 1, y, bn), "must have folded"),
        "decompose_batchnorm": (Block(Kind.BATCHNORM, "module", 1, y, bn), "BN calls left"),
        "remove_dropout": (Block(Kind.DROPOUT, "module", 1, y, dropout), "dropout module"),
        "fold_conv_arithmetic": (
            Block(Kind.ARITHMETIC, "operator", 1, y, {"op": "mul", "const": "scalar", "value": 2}),
            "not folded",
        ),
    }
    for name, (block, message) in cases.items():
        blocks = (Block(Kind.CONV, "module", 0, y, conv), block)
        spec = ModelSpec(x, 1, Layout.CONTIGUOUS, blocks, (2,), 0)
        model = build(spec)
        gm = fx.symbolic_trace(model)
        report = fxmobile.Report("FuzzModel", [PassRecord(name, RecordStage.FX, Status.RAN)])
        with pytest.raises(AssertionError, match=message):
            check_structure(spec, model, gm, report)

    # a conv called twice, rewritten in place (pytorch/pytorch#104593)
    same = {**conv, "out_channels": 2}
    blocks = (
        Block(Kind.CONV, "module", 0, x, same),
        Block(Kind.CONV, "module", 1, x, same, owner=0),
    )
    spec = ModelSpec(x, 1, Layout.CONTIGUOUS, blocks, (2,), 0)
    model = build(spec)
    gm = fx.symbolic_trace(copy.deepcopy(model))
    with torch.no_grad():
        gm.get_parameter("b0.weight").mul_(2)
    with pytest.raises(AssertionError, match="rewritten in place"):
        check_structure(spec, model, gm, fxmobile.Report("FuzzModel"))


def test_generated_models_are_valid_and_traceable() -> None:
    """The generator's promise, checked apart from fxmobile: eager runs, fx traces the model."""

    @settings(max_examples=50, derandomize=True, database=None, deadline=None)
    @given(spec=model_specs())
    def check(spec: ModelSpec) -> None:
        model = build(spec)
        out, _ = run(model, spec)
        for t, v in zip(leaves(out), [spec.values()[k] for k in spec.outputs], strict=True):
            assert tuple(t.shape) == v.shape(spec.batch), spec
            assert t.dtype == v.dtype, spec
        gm = fx.symbolic_trace(copy.deepcopy(model))
        assert_outputs_identical(out, run(gm, spec)[0])
        assert_outputs_identical(out, run(pickle.loads(pickle.dumps(model)), spec)[0])

    check()


# ----------------------------------------------------------------------------- regressions

# Every failure the fuzzer found and shrank, as an explicit small model named after what it
# guards (the fuzzer's shrunk program is in each docstring when it differs).


class InPlaceOnInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1)


@pytest.mark.parametrize(
    "model", [nn.Sequential(nn.ReLU(inplace=True)), InPlaceOnInput()], ids=["relu_", "add_"]
)
def test_regression_example_inputs_not_written_by_shape_propagation(model: nn.Module) -> None:
    """A model that writes to its input in place (as eager does) must not write to the caller's
    ``example_inputs`` while being optimized: shape propagation ran the graph on them, once per
    pass that needs shapes, and the final numerical check then compared against eager on
    inputs that had changed (``x.add_(1)`` reported a 40% mismatch)."""
    model.eval()
    x = torch.tensor([[1.5], [-0.25]])
    given = x.clone()
    result = fxmobile.optimize_fx(model, given)
    assert torch.equal(given, x), f"example_inputs changed: {x.flatten()} -> {given.flatten()}"
    assert result.report.numerics_passed


class InPlaceAfterAddZero(nn.Module):
    """``y = x + 0`` is a new tensor: the in-place op on it must not reach ``x``."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + 0
        F.hardswish(y, inplace=True)
        return y, x * 2


class InPlaceOnViewAfterMulOne(nn.Module):
    """The fuzzer's shrunk case: the write goes through a view (flatten) of ``y = x * 1``."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = torch.relu(x)
        y = r * 1
        y.flatten(1).relu_().sub_(1)
        return y, r


class InPlaceOnSourceAfterAddZero(nn.Module):
    """The other direction (shrunk by the fuzzer): ``x`` is written after ``y = x + 0`` was
    taken; ``y`` must keep the old values."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + 0
        return nn.functional.relu(x, inplace=True), y


@pytest.mark.parametrize(
    "model", [InPlaceAfterAddZero(), InPlaceOnViewAfterMulOne(), InPlaceOnSourceAfterAddZero()]
)
def test_regression_identity_arithmetic_before_in_place_op(model: nn.Module) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4)
    gm = fxmobile.optimize_fx(model.eval(), x.clone()).graph_module
    assert_acts_like_eager(model, gm, x, exact=True)


class ReluInPlaceOnInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 1, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.relu_(x))


def test_regression_channels_last_keeps_the_write_to_the_input() -> None:
    """Eager ``relu_`` on the input writes to the caller's tensor; converting the input to
    channels-last made the write land on a copy (found by the fuzzer with ToChannelsLast)."""
    torch.manual_seed(0)
    model = ReluInPlaceOnInput().eval()
    x = torch.randn(1, 2, 3, 3)
    gm = fxmobile.optimize_fx(model, x.clone(), channels_last=True).graph_module
    assert_acts_like_eager(model, gm, x)


class InPlaceThroughFlattenModule(nn.Module):
    """The long profile's shrunk case: ``nn.Flatten`` of the input is a view of it, so the
    in-place ReLU after it writes to the caller's tensor in eager."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 1, 1, bias=False)
        self.flatten = nn.Flatten()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.relu(self.flatten(x)) * 2, self.conv(x)


def test_regression_channels_last_sees_writes_through_view_modules() -> None:
    """``written_in_place`` followed view *functions* only; through the ``nn.Flatten`` module
    the write went unseen, the input was converted to a channels-last copy, and the write
    landed on the copy (found by the 20,000-model profile)."""
    torch.manual_seed(0)
    model = InPlaceThroughFlattenModule().eval()
    x = torch.randn(1, 2, 3, 3)
    result = fxmobile.optimize_fx(model, x.clone(), channels_last=True)
    assert result.report.record("to_channels_last").skips == {
        "input is written in place by forward": 1
    }
    assert_acts_like_eager(model, result.graph_module, x)


class InPlaceClampThenConv1d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.clamp = nn.Hardtanh(0.0, 0.05, inplace=True)
        self.conv = nn.Conv1d(1, 1, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        self.clamp(y)  # writes y, which the conv then reads
        return self.conv(y)


@pytest.mark.skipif(not HAS_SCRIPT_STAGE, reason="fxmobile.optimize is not exported yet")
def test_regression_script_conv1d_is_not_moved_past_a_write_to_its_input() -> None:
    """torch's conv1d -> conv2d rewrite put the new conv2d *before* ``hardtanh_(y)``, and the
    write, now unused, was removed as dead code: the conv read the unclamped ``y`` (found by
    the 20,000-model profile, error 30x the output's scale)."""
    torch.manual_seed(0)
    model = InPlaceClampThenConv1d().eval()
    x = torch.rand(1, 1, 3)
    result = fxmobile.optimize(model, example_inputs=x, backend="CPU")
    assert result.report.record("conv1d_to_conv2d").skips == {"method writes tensors in place": 1}
    assert_equivalent(model, result.module, x)


class AugmentedAssignToInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor(0.3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.dropout(x, p=0.0, training=False)  # x itself
        out = torch.relu(y)
        y += self.c  # writes the caller's x in eager
        return out


def test_regression_augmented_assignment_to_an_input_is_refused() -> None:
    """torch.fx traces ``y += c`` as ``y = y + c``: eager wrote to the caller's input, the
    captured graph did not (found by the 20,000-model profile: the input 0.21 off after the
    call). The write cannot be captured, so the model is refused with the fix."""
    model = AugmentedAssignToInput().eval()
    x = torch.randn(1, 1, 3, 3, 3)
    with pytest.raises(fxmobile.CaptureError, match=r"writes to its input 'x' in place.*x\.add_"):
        fxmobile.optimize_fx(model, x.clone())
    given = x.clone()
    with pytest.raises(fxmobile.CaptureError):
        fxmobile.optimize(model, example_inputs=given)
    assert torch.equal(given, x), "the caller's example input was written"

    # a NaN in an input is not a write (NaN != NaN under torch.equal)
    nan_input = torch.randn(1, 2, 3, 3)
    nan_input[0, 0, 0, 0] = float("nan")
    conv = nn.Sequential(nn.Conv2d(2, 2, 1)).eval()
    fxmobile.optimize_fx(conv, nan_input, tolerance=float("inf"))


class WriteThroughViewThenAddRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor(0.7))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.unsqueeze(-1).add_(self.c)  # writes x through a view
        return torch.relu(x + x)


@pytest.mark.skipif(not HAS_SCRIPT_STAGE, reason="fxmobile.optimize is not exported yet")
def test_regression_add_relu_fusion_is_not_moved_before_a_write_to_its_input() -> None:
    """torch's add + relu fusion placed ``_add_relu(x, x)`` before ``unsqueeze(x).add_(c)``, so
    it read ``x`` unwritten (found by the 20,000-model profile, error 0.41 of a scale of 3.5)."""
    model = WriteThroughViewThenAddRelu().eval()
    x = torch.rand(1, 1, 3)
    result = fxmobile.optimize(model, example_inputs=x.clone(), backend="CPU")
    assert result.report.numerics_passed
    assert result.report.record("fuse_add_relu").skips == {ALIASED: 1}
    assert_acts_like_eager(model, result.module, x)


class ReadThenAddInPlaceThenRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor(0.7))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        before = torch.relu(x)  # reads x before the add_ writes it
        return torch.relu_(x.add_(self.c)), before


@pytest.mark.skipif(not HAS_SCRIPT_STAGE, reason="fxmobile.optimize is not exported yet")
def test_regression_add_relu_fusion_is_not_moved_above_a_read_of_what_it_writes() -> None:
    """torch's rewrite placed ``_add_relu_(x, c)`` above ``relu(x)``, which then read the
    written ``x`` (found by the 20,000-model profile: 0.21 off a scale of 1.5)."""
    model = ReadThenAddInPlaceThenRelu().eval()
    x = torch.tensor([[-0.5, 0.3, -0.1]])
    result = fxmobile.optimize(model, example_inputs=x.clone(), backend="CPU")
    assert result.report.numerics_passed
    assert result.report.record("fuse_add_relu").skips == {READ_ELSEWHERE: 1}
    assert_acts_like_eager(model, result.module, x, exact=True)


class ReversedConstantAddThenRelu(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor(3e9, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.c + x)


@pytest.mark.skipif(not HAS_SCRIPT_STAGE, reason="fxmobile.optimize is not exported yet")
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64], ids=str)
def test_regression_add_relu_fusion_leaves_a_constant_first_operand(dtype: torch.dtype) -> None:
    """``_add_relu`` clamps in its first operand's dtype: with a float64 0-dim constant first
    the optimized float32 model failed ("value cannot be converted to type float without
    overflow", found by the 20,000-model profile); an int64 one would clamp at its maximum."""
    model = ReversedConstantAddThenRelu(dtype).eval()
    x = torch.randn(1, 1, 3) * 1e10
    result = fxmobile.optimize(model, example_inputs=x, backend="CPU")
    assert result.report.record("fuse_add_relu").skips == {MIXED_DTYPES: 1}
    with torch.no_grad():
        assert torch.equal(result.module(x), model(x))


class WriteThroughDropoutThatNeverDrops(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor(-0.7))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(x) * self.c
        torch.relu_(F.dropout(y, p=0.0))  # training=True, but p=0: the input itself
        return torch.relu(y), y


class DropoutThatNeverDropsOnTheInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(1, 1, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(torch.relu(F.relu(F.dropout(x, p=0.0), inplace=True)))


@pytest.mark.skipif(not HAS_SCRIPT_STAGE, reason="fxmobile.optimize is not exported yet")
@pytest.mark.parametrize(
    "model, x",
    [
        (WriteThroughDropoutThatNeverDrops(), torch.tensor([[1.5]])),
        (DropoutThatNeverDropsOnTheInput(), torch.randn(1, 1, 3, 6)[..., ::2]),
    ],
    ids=["write-to-an-intermediate", "write-to-a-strided-input"],
)
def test_regression_dropout_with_p_zero_keeps_the_write_through_it(
    model: nn.Module, x: torch.Tensor
) -> None:
    """``F.dropout(y, p=0)`` returns ``y`` itself, in training mode too, so ``relu_`` on it
    writes ``y``. It was kept (training=True), TorchScript's freezing then dropped the
    ``relu_`` as dead code (its schema says dropout returns a fresh tensor), and channels-last
    converted an input it did not see written (found by the 20,000-model profile: 2.5 off a
    scale of 0, and 1.1 off 1.4)."""
    model.eval()
    result = fxmobile.optimize(model, example_inputs=x.clone(), backend="CPU")
    fx_dropout = next(r for r in result.report.passes if r.name == "remove_dropout")
    assert fx_dropout.stage is RecordStage.FX and fx_dropout.rewrites == 1
    assert result.report.numerics_passed
    assert_acts_like_eager(model, result.module, x)


class WriteThroughFlattenOfConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose2d(2, 2, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        torch.relu_(torch.flatten(y, 1))  # a view of y in NCHW: writes y
        return F.hardswish(y)


@pytest.mark.skipif(not HAS_SCRIPT_STAGE, reason="fxmobile.optimize is not exported yet")
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_regression_write_through_flatten_of_a_conv_output(channels_last: bool) -> None:
    """``flatten`` is a view of an NCHW tensor but a copy of a channels-last one. The prepacked
    conv returned channels-last output for NCHW input, and the channels-last pass converted
    such graphs, so ``relu_(flatten(y))`` stopped writing ``y`` (found by the 20,000-model
    profile: 0.35 off a scale of 0.29). Outputs now keep the input's layout, and the pass
    declines a write through a reshape."""
    torch.manual_seed(0)
    model = WriteThroughFlattenOfConv().eval()
    x = torch.randn(1, 2, 3, 3)
    result = fxmobile.optimize(model, example_inputs=x, channels_last=channels_last)
    assert result.report.numerics_passed
    assert_equivalent(model, result.module, x)
    if channels_last:
        skips = result.report.record("to_channels_last").skips
        assert skips == {
            "a value is written in place through a reshape (a copy once channels-last)": 1
        }


@pytest.mark.skipif(not HAS_SCRIPT_STAGE, reason="fxmobile.optimize is not exported yet")
@pytest.mark.parametrize("padding", ["same", "valid"])
def test_regression_script_conv1d_with_string_padding(padding: str) -> None:
    """``Conv1d(padding="same")`` traces to the ``aten::conv1d.padding`` overload (a string);
    the conv1d -> conv2d rewrite treated it as ``int[]`` and the next pass crashed with a torch
    INTERNAL ASSERT ("Expected GenericList but got String")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(2, 3, 3, padding=padding)).eval()
    x = torch.randn(1, 2, 5)
    result = fxmobile.optimize(model, example_inputs=x, backend="CPU")
    assert_equivalent(model, result.module, x)
