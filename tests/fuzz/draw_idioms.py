"""Strategies for the idioms users write (issue 11.5), drawn into the same models as the rest.

A layer written as a module may carry hooks (one in three), be a subclass overriding
``forward`` (one in eight) and, for convs and linears, have parametrized weights (one in five);
a block may write through views of a value or of a copy of it, or be a cache filled in
``forward``; the model may return its outputs in any container, carry hooks itself, and (rarely)
be optimized while torch's global module hooks are registered. Every choice keeps the model
valid: shapes and dtypes are unchanged by the hooks, and every view is valid for any strides.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from tests.fuzz.dynamic import BRANCH_CONDITIONS
from tests.fuzz.layers import NEW_API, SUBCLASS_EXTRAS
from tests.fuzz.outputs import OUTPUT_TYPES
from tests.fuzz.spec import (
    FORWARD_HOOKS,
    PURE_HOOKS,
    STATEFUL_HOOKS,
    Block,
    HookSpec,
    Kind,
    Value,
)
from tests.fuzz.views import COPIES, VIEWS, WRITES, Args, view_shape

Draw = Callable[[st.SearchStrategy[Any]], Any]
CONSTANTS = st.sampled_from((0.5, -1.5, 2.0, 0.25))
_PRE_HOOKS = tuple(n for n in (*PURE_HOOKS, *STATEFUL_HOOKS) if n not in FORWARD_HOOKS)


def _draw_hook(draw: Draw, pre_only: bool = False) -> HookSpec:
    """Pure hooks three times in four (they are traced), stateful ones otherwise (kept)."""
    pure = draw(st.sampled_from((True, True, True, False)))
    names: tuple[str, ...] = PURE_HOOKS if pure else STATEFUL_HOOKS
    if pre_only:
        names = tuple(n for n in names if n in _PRE_HOOKS)
    return HookSpec(draw(st.sampled_from(names)), draw(CONSTANTS))


def weight_shape(kind: Kind, x: Value, opts: dict[str, Any]) -> tuple[int, ...]:
    """The shape of the weight of a conv, transposed conv or linear block."""
    if kind is Kind.LINEAR:
        return (opts["out_features"], x.spatial[-1] if x.dims else x.channels)
    per_group = (x.channels // opts["groups"], opts["out_channels"] // opts["groups"])
    if kind is Kind.CONV:
        return (opts["out_channels"], per_group[0], *opts["kernel"])
    return (x.channels, per_group[1], *opts["kernel"])


def _draw_parametrize(draw: Draw, kind: Kind, x: Value, opts: dict[str, Any]) -> tuple[str, ...]:
    """torch's parametrizations (orthogonal on square float32/float64 weights only), the older
    pre-hook API, or custom ones (on the weight or the bias); a custom one may be stacked on a
    new-API one."""
    shape = weight_shape(kind, x, opts)
    bias = ["scale_bias"] if opts["bias"] else []
    families = {
        "torch": ["weight_norm", "spectral_norm"],
        "older": ["old_weight_norm", "old_spectral_norm"],
        "custom": ["scale", "softsign", *bias],
    }
    # square weights are rare: favour them. Not in float16 or bfloat16, where torch's own
    # orthogonal parametrization fails in eager (its ``base`` is None: long profile, seed 2026)
    square = shape[-1] == shape[-2] and x.dtype in (torch.float32, torch.float64)
    if square and draw(st.booleans()):
        names = ["orthogonal"]
    else:
        names = [draw(st.sampled_from(families[draw(st.sampled_from(tuple(families)))]))]
    if names[0] in NEW_API and draw(st.booleans()):  # a second one, stacked
        names.append(draw(st.sampled_from(["scale", "softsign", *bias])))
    return tuple(names)


def draw_decorations(draw: Draw, kind: Kind, x: Value, opts: dict[str, Any]) -> dict[str, Any]:
    """Options of a module-form layer: hooks, a subclass overriding ``forward``, and (convs and
    linears) parametrizations."""
    extra: dict[str, Any] = {}
    if draw(st.integers(0, 2)) == 2:
        extra["hooks"] = tuple(_draw_hook(draw) for _ in range(draw(st.integers(1, 2))))
    # a subclassed BatchNorm is refused (untraceable control flow): one in three times as often
    subclass = draw(st.integers(0, 23 if kind is Kind.BATCHNORM else 7)) == 7
    if subclass:
        extras = SUBCLASS_EXTRAS if kind in (Kind.CONV, Kind.LINEAR) else SUBCLASS_EXTRAS[:-1]
        extra["subclass"] = draw(st.sampled_from(extras))
        extra["gain"] = draw(CONSTANTS)
    if kind in (Kind.CONV, Kind.CONV_TRANSPOSE, Kind.LINEAR) and draw(st.integers(0, 4)) == 4:
        extra["parametrize"] = _draw_parametrize(draw, kind, x, opts)
    return extra


def _draw_view(draw: Draw, shape: tuple[int, ...]) -> tuple[str, Args]:
    """The op first, then its spelling: every op shows up about as often."""
    names = [name for name, view in VIEWS.items() if view.args(shape)]
    family = draw(st.sampled_from(list(dict.fromkeys(VIEWS[n].family for n in names))))
    name = draw(st.sampled_from([n for n in names if VIEWS[n].family == family]))
    return name, draw(st.sampled_from(VIEWS[name].args(shape)))


def draw_view_write(draw: Draw, x: Value, batch: int) -> tuple[str, dict[str, Any], Value]:
    """A write through one or two views, of the value itself or of a copy of it."""
    copy = draw(st.sampled_from(("add0", None, *(c for c in COPIES if c != "add0"))))
    shape = x.shape(batch)
    views = [_draw_view(draw, shape)]
    second = view_shape(shape, *views[0])
    if math.prod(second) and draw(st.integers(0, 2)) == 2:
        views.append(_draw_view(draw, second))
    opts: dict[str, Any] = {
        "copy": copy,
        "views": tuple(views),
        "write": draw(st.sampled_from(tuple(WRITES))),
    }
    opts["value"] = draw(CONSTANTS)
    if copy is not None:
        opts["read_source"] = draw(st.booleans())
    return "method", opts, x


def draw_cache(draw: Draw, x: Value) -> tuple[str, dict[str, Any], Value]:
    """A cache filled in ``forward``: a dict scale, or LeViT's bias cache keyed by device."""
    pattern = draw(st.sampled_from(("dict", "dict", "levit")))  # LeViT's is refused
    opts = {"pattern": pattern}
    if pattern == "dict":
        opts["op"] = draw(st.sampled_from(("mul", "add")))
    return "module", opts, x


def draw_branch(draw: Draw, x: Value) -> tuple[str, dict[str, Any], Value]:
    """An ``if`` on the value's layout, dtype or shape, in a submodule or in forward itself."""
    form = draw(st.sampled_from(("module", "inline")))
    return form, {"on": draw(st.sampled_from(BRANCH_CONDITIONS)), "value": draw(CONSTANTS)}, x


# random factories three times in four; seed calls and generators (refused) otherwise
_RANDOM_CALLS = ("randn", "randn", "rand", "normal", "randint", "randn_batch", "seed", "generator")


def draw_random(draw: Draw, x: Value) -> tuple[str, dict[str, Any], Value]:
    """A random draw added to the value, in forward itself."""
    call = draw(st.sampled_from(_RANDOM_CALLS))
    return "inline", {"call": call, "scale": draw(CONSTANTS)}, x


def draw_counter(draw: Draw, x: Value) -> tuple[str, dict[str, Any], Value]:
    return "module", {"gain": draw(CONSTANTS)}, x


def draw_probe(draw: Draw, spec_dims: int) -> str | None:
    """The input the check runs beyond the example, one model in two: with NaN and infinities,
    in another layout (channels-last for a 4-D or 5-D input), or of another batch size."""
    probes = ["nonfinite", "nonfinite", "strided", "batch"]
    probes += ["channels_last"] * 2 if spec_dims in (2, 3) else []
    return draw(st.sampled_from([None] * len(probes) + probes))


def draw_model_idioms(draw: Draw, blocks: list[Block], outputs: tuple[int, ...]) -> dict[str, Any]:
    """Model-level idioms: the output container, hooks on the model itself, torch's global
    module hooks (rarely: the docs document refusing them), empty caches, an optional input
    left at None."""
    idioms: dict[str, Any] = {}
    idioms["output_type"] = draw(st.sampled_from(("plain",) * 5 + OUTPUT_TYPES[1:]))
    single = idioms["output_type"] == "plain" and len(outputs) == 1
    if draw(st.integers(0, 11)) == 11:
        idioms["root_hooks"] = (_draw_hook(draw, pre_only=not single),)
    if draw(st.integers(0, 59)) == 59:
        idioms["global_hook"] = draw(st.sampled_from(("forward", "pre")))
    if any(b.kind is Kind.CACHE for b in blocks):
        idioms["cold_cache"] = draw(st.integers(0, 3)) == 3  # refused: rarely
    idioms["optional_input"] = draw(st.integers(0, 9)) == 9
    return idioms
