"""The fuzz oracle: what the optimized model must compute, anchored in float64.

Each model is run in eager (its dtype), in float64 (the anchor) and in the ways rounding may
legitimately move it (every parameter or every intermediate nudged by one unit in the last
place, the input in the other memory layout). The optimized model's result must lie within a
few times that rounding noise of the anchor (``assert_close_to_anchor``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from tests.fuzz.dynamic import counters_kept
from tests.fuzz.outputs import flatten
from tests.fuzz.spec import Kind, Layout, ModelSpec, example_input
from tests.fuzz.views import VIEWS


def layout_sensitive_writes(spec: ModelSpec) -> bool:
    """Whether the model writes through a view whose meaning depends on the memory layout."""
    return any(
        VIEWS[name].layout_dependent or VIEWS[name].reads_strides
        for b in spec.blocks
        if b.kind is Kind.VIEW_WRITE
        for name, _ in b.options["views"]
    )


def run(
    module: Callable[..., Any],
    spec: ModelSpec,
    dtype: torch.dtype | None = None,
    memory_format: torch.memory_format | None = None,
) -> Any:
    """``(outputs, input after the call)``: a fresh input each time (a forward may write to it;
    a clone would lose the strided layout), in ``dtype`` and ``memory_format`` when given.
    Every run draws from torch's generator seeded with ``spec.seed`` (eager and the optimized
    module draw the same numbers) and starts from the module's call counts as they were
    (``tests.fuzz.dynamic``)."""
    x = example_input(spec, dtype)
    if memory_format is not None:
        x = x.contiguous(memory_format=memory_format)
    with torch.no_grad(), torch.random.fork_rng(devices=[]), counters_kept(module, spec):
        torch.manual_seed(spec.seed)
        return module(x), x


def leaves(outputs: Any) -> list[torch.Tensor]:
    """The tensors of a model's outputs, in order, whatever the container."""
    return flatten(outputs)


# float64 rounds 2**29 times finer than float32 (unit roundoff 2**-53 against 2**-24).
FLOAT64_PER_FLOAT32 = 2.0**-29
# Floors of the bound, relative to the output's scale, for when eager's own error is zero or
# small by luck (an exact model, a single output element): 1e-5 is about 80 float32 ulps of
# the largest output. The float64 floor is 4x that in float64 ulps: the long profile found
# ``BN(BN_batch_stats(x - x))`` in float64 at 90 ulps (2.0e-14 of the scale) while eager was
# exact by luck: batch statistics of a constant cancel, and the folded BN rounds elsewhere.
# Still ten orders of magnitude below what a bug does.
REL_FLOOR = {torch.float32: 1e-5, torch.float64: 4e-5 * FLOAT64_PER_FLOAT32}
# float16 and bfloat16 keep 11 and 8 bits: their floor is 4 units in the last place of the scale
# (4e-3 and 3e-2), still below the errors of a bug (a wrong fold is off by 9.5e-2 of the scale,
# a lost bias by more) and within fxmobile's own tolerances for them (1e-2 and 5e-2).
REL_FLOOR |= {t: 4 * torch.finfo(t).eps for t in (torch.float16, torch.bfloat16)}
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
    bound = anchor_bound(noise, scale, dtype)
    assert err <= bound, (
        f"{where}: max abs error {err:.3g} against the float64 anchor exceeds {bound:.3g} "
        f"(rounding noise {noise:.3g}, output scale {scale:.3g})"
    )


def anchor_bound(noise: float, scale: float, dtype: torch.dtype) -> float:
    """How far from the float64 anchor a correct result of ``dtype`` may be (see above). Ill
    conditioning is measured in the dtype's own units: float16 and bfloat16 round 2**13 and
    2**16 times coarser than float32, and their noise is that much larger on every output."""
    coarser = max(1.0, torch.finfo(dtype).eps / torch.finfo(torch.float32).eps)
    factor = 32 if noise > ILL_CONDITIONED * coarser * scale else 4
    return max(factor * noise, REL_FLOOR[dtype] * scale) + TINY


def assert_nonfinite_like_eager(
    got: torch.Tensor, eager: torch.Tensor, noise: float, scale: float, where: str
) -> None:
    """On an input with NaN and infinities (``ModelSpec.nonfinite``), ``got`` has NaN exactly
    where eager has NaN, the same infinities where eager has them (ATen propagates both, and so
    must every kernel and rewrite), and its finite elements within the example's rounding bound
    of eager's: the input's finite entries are the example's, so a finite element is computed
    from the same values (``noise`` and ``scale`` are the example's, against its anchor; eager
    is within 1x the noise of the anchor, a correct result within the bound)."""
    assert got.shape == eager.shape, f"{where}: shape {tuple(got.shape)} != {tuple(eager.shape)}"
    assert got.dtype == eager.dtype, f"{where} is {got.dtype}, eager's {eager.dtype}"
    nan_got, nan_eager = got.isnan(), eager.isnan()
    assert torch.equal(nan_got, nan_eager), (
        f"{where}: NaN at {int((nan_got & ~nan_eager).sum())} elements where eager has none, "
        f"and not at {int((nan_eager & ~nan_got).sum())} of eager's NaN (input with NaN and "
        f"infinities)"
    )
    inf_eager = eager.isinf()
    same_inf = torch.equal(got.isinf(), inf_eager) and torch.equal(got[inf_eager], eager[inf_eager])
    assert same_inf, (
        f"{where}: infinities differ from eager's (input with NaN and infinities): "
        f"{got[inf_eager | got.isinf()].tolist()[:8]} against "
        f"{eager[inf_eager | got.isinf()].tolist()[:8]}"
    )
    finite = eager.isfinite()
    if not bool(finite.any()):
        return
    err = float((got[finite].double() - eager[finite].double()).abs().max())
    bound = anchor_bound(noise, scale, eager.dtype) + noise
    assert err <= bound, (
        f"{where}: the finite elements are off eager's by {err:.3g}, beyond {bound:.3g} (input "
        f"with NaN and infinities; rounding noise {noise:.3g}, output scale {scale:.3g})"
    )


def in_dtype(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy with every floating tensor in ``dtype``, plain tensor attributes and the tensors
    a cache holds included (``Module.to`` converts only parameters and buffers)."""
    copied = copy.deepcopy(model).to(dtype)
    for sub in copied.modules():
        for name, value in list(vars(sub).items()):
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                object.__setattr__(sub, name, value.to(dtype))
            elif isinstance(value, dict) and not name.startswith("_"):  # a cache
                for key, item in value.items():
                    if isinstance(item, torch.Tensor) and item.is_floating_point():
                        value[key] = item.to(dtype)
    return copied


def results(
    module: Callable[..., Any],
    spec: ModelSpec,
    dtype: torch.dtype | None = None,
    memory_format: torch.memory_format | None = None,
) -> Any:
    """The tensors a call produces: its outputs, and its input after the call (a forward that
    writes to its input in place computes values into it, like an output)."""
    return outputs_and_results(module, spec, dtype, memory_format)[1]


def outputs_and_results(
    module: Callable[..., Any],
    spec: ModelSpec,
    dtype: torch.dtype | None = None,
    memory_format: torch.memory_format | None = None,
) -> tuple[Any, list[torch.Tensor]]:
    """What a call returns, as returned, and ``results``."""
    outputs, written_input = run(module, spec, dtype, memory_format)
    return outputs, [*leaves(outputs), written_input]


def other_layout(spec: ModelSpec) -> torch.memory_format | None:
    """The layout the optimized model may switch a 4-D or 5-D input to (or back from); None
    where the layout changes more than rounding: the model writes in place and flattens (a
    write through ``flatten`` of a channels-last tensor lands on a copy), or writes through a
    view that depends on the layout or reads it (``as_strided``)."""
    channels_last = {2: torch.channels_last, 3: torch.channels_last_3d}.get(spec.input.dims)
    if channels_last is None or spec.input.extra_dim:
        return None
    flattens = any(b.kind is Kind.FLATTEN for b in spec.blocks)
    if (spec.writes_in_place() and flattens) or layout_sensitive_writes(spec):
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
    relaid = None
    if layout is not None:
        with BatchStatisticsIn(layout):
            relaid = results(model, spec, memory_format=layout)
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
        # values); the CPU stage makes that change, and the channels-last rewrite makes it for
        # BatchNorms eager feeds NCHW (found by the long profile: torch's channels-last kernel
        # erred 20x more on the same float32 input, 7.7e-6 against 3.9e-7).
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


class BatchStatisticsIn(TorchFunctionMode):
    """Every BatchNorm input of 4 or 5 dims in ``layout`` (its channels-last twin for 5 dims),
    as a channels-last rewrite of the whole model gives it; nothing else changes."""

    def __init__(self, layout: torch.memory_format) -> None:
        super().__init__()
        self.layout = layout

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        if func in (torch.nn.functional.batch_norm, torch.batch_norm) and args:
            x, *rest = args
            layout = _layout_for(x.dim(), self.layout)
            if layout is not None:
                args = (x.contiguous(memory_format=layout), *rest)
        return func(*args, **(kwargs or {}))


def _layout_for(dims: int, layout: torch.memory_format) -> torch.memory_format | None:
    if layout is torch.contiguous_format:
        return layout if dims in (4, 5) else None
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(dims)


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
    tolerance: dict[str, Any] = {"rtol": 0.0, "atol": 0.0} if exact else {}
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, **tolerance)
    assert torch.equal(got_input, expected_input), "the input after the call differs from eager's"
