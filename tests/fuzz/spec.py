"""What a fuzzed model is: the types of its values, its blocks, and the whole program.

A model is a *program*: a tuple of ``Block``s that ``FuzzModel.forward`` (``tests.fuzz.build``)
runs in order. Value 0 is the input; block ``i`` reads earlier values (``src``, and ``other``
for a binary op) and its result is value ``i + 1``. Tensor values (weights, BatchNorm
statistics, constants, the input) come from ``ModelSpec.seed``, so a spec rebuilds the same
model every time. The spec prints as a readable program.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tests.fuzz.views import VIEWS

CHANNEL_CAP = 16
SPATIAL_CAP = {1: 16, 2: 12, 3: 7}  # every value's spatial sizes stay within its rank's cap
INPUT_SPATIAL = {1: (3, 9), 2: (3, 9), 3: (3, 6)}
FLATTEN_CAP = 2048  # features a flatten may produce (the Linear after it stays small)
MAX_BLOCKS = 8


# The fuzzer's views that read memory order or copy for some strides, and the view, reshape and
# unflatten spellings the rule of docs/pages/capture.md names whatever the shape.
MEMORY_ORDER_VIEWS = frozenset(
    name
    for name, view in VIEWS.items()
    if view.layout_dependent or view.reads_strides or view.family in ("view", "unflatten")
)


class Kind(enum.Enum):
    """What a block computes; the order is the order hypothesis shrinks towards."""

    ACTIVATION = "activation"
    CONV = "conv"
    BATCHNORM = "batchnorm"
    ARITHMETIC = "arithmetic"  # with a constant
    LINEAR = "linear"
    DROPOUT = "dropout"
    BINARY = "binary"  # with an earlier value: residual add, sub, mul, cat
    CONV_TRANSPOSE = "conv_transpose"
    FLATTEN = "flatten"
    UNSQUEEZE = "unsqueeze"
    VIEW_WRITE = "view_write"  # a write through views of the value, or of a copy of it
    CACHE = "cache"  # a submodule that caches a tensor in a dict the first time it runs
    BRANCH = "branch"  # an ``if`` on the value's layout, dtype or shape (``tests.fuzz.dynamic``)
    RANDOM = "random"  # a random factory without tensor arguments, or a seed call, in forward
    COUNTER = "counter"  # a submodule counting its calls in a buffer that its output reads


PRODUCERS = (Kind.CONV, Kind.CONV_TRANSPOSE, Kind.LINEAR)
SHAREABLE = (*PRODUCERS, Kind.BATCHNORM)
# kinds whose module form may carry hooks or be a subclass overriding forward
HOOKABLE = (*PRODUCERS, Kind.BATCHNORM, Kind.ACTIVATION)
# hooks by name (``tests.fuzz.hooks``): plain functions the hook rule
# (docs/pages/capture.md#hooks) says are traced into the graph, and hooks with state that stay
# with their module
PURE_HOOKS = (
    "scale", "shift", "relu", "scale_in_place", "kwargs_shift", "pre_scale",
    "pre_scale_in_place", "pre_kwargs_shift",
)  # fmt: skip
STATEFUL_HOOKS = ("recorder", "pre_recorder", "counter", "bound_scale", "partial_scale")
IN_PLACE_HOOKS = ("scale_in_place", "pre_scale_in_place")
FORWARD_HOOKS = ("scale", "shift", "relu", "scale_in_place", "kwargs_shift", "recorder",
                 "counter", "bound_scale", "partial_scale")  # fmt: skip


@dataclass(frozen=True)
class HookSpec:
    """A hook to register: its name in ``tests.fuzz.hooks.HOOKS`` and its constant."""

    name: str
    constant: float = 1.0

    @property
    def traceable(self) -> bool:
        """Whether the hook rule (docs/pages/capture.md#hooks) says fxmobile traces it."""
        return self.name in PURE_HOOKS

    @property
    def forward(self) -> bool:
        """A forward hook (it sees the output), not a pre-hook."""
        return self.name in FORWARD_HOOKS

    def __repr__(self) -> str:
        return f"{self.name}({self.constant:g})"


class Layout(enum.Enum):
    CONTIGUOUS = "contiguous"
    CHANNELS_LAST = "channels_last"  # channels_last for 4-D, channels_last_3d for 5-D
    STRIDED = "strided"  # a view of every other element of the last dim


@dataclass(frozen=True)
class Value:
    """The type of a value: ``[N, channels, *spatial]``, or ``[N, channels]`` with no spatial."""

    channels: int
    spatial: tuple[int, ...]
    dtype: torch.dtype
    extra_dim: bool = False  # a constant with more dims made it ``[1, N, C, *spatial]``

    @property
    def dims(self) -> int:
        return len(self.spatial)

    def shape(self, batch: int) -> tuple[int, ...]:
        lead = (1,) if self.extra_dim else ()
        return (*lead, batch, self.channels, *self.spatial)

    def __str__(self) -> str:
        lead = "1, " if self.extra_dim else ""
        dims = "".join(f", {s}" for s in self.spatial)
        return f"[{lead}N, {self.channels}{dims}] {str(self.dtype).removeprefix('torch.')}"


@dataclass(frozen=True)
class Block:
    """One step of the program. ``form`` says how it is written (module, function, method...);
    ``owner`` is the block whose module or tensors a repeated call reuses."""

    kind: Kind
    form: str
    src: int
    out: Value
    options: dict[str, Any] = field(default_factory=dict)
    other: int | None = None
    owner: int | None = None

    @property
    def inplace(self) -> bool:
        """Whether the block itself writes a tensor in place (its hooks aside)."""
        explicit = bool(self.options.get("inplace")) or self.form == "inplace"
        return explicit or self.kind is Kind.VIEW_WRITE

    @property
    def hooks(self) -> tuple[HookSpec, ...]:
        return tuple(self.options.get("hooks", ()))

    @property
    def kept_hooks(self) -> bool:
        """Its module has a hook the hook rule says stays with it (no rewrite crosses it)."""
        return any(not h.traceable for h in self.hooks)

    def describe(self, index: int) -> str:
        args = f"v{self.src}" + (f", v{self.other}" if self.other is not None else "")
        shared = f" calls block {self.owner}'s" if self.owner is not None else ""
        opts = " ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"v{index + 1} = {self.kind.value}[{self.form}{shared}]({args}) {opts} -> {self.out}"


@dataclass(frozen=True)
class ModelSpec:
    """A whole model: the input, the program, which values it returns, and the value seed."""

    input: Value
    batch: int
    layout: Layout
    blocks: tuple[Block, ...]
    outputs: tuple[int, ...]
    seed: int
    output_type: str = "plain"  # tests.fuzz.outputs.OUTPUT_TYPES
    root_hooks: tuple[HookSpec, ...] = ()  # hooks on the model itself
    global_hook: str | None = None  # torch's global module hook registered while optimizing
    cold_cache: bool = False  # the caches are empty when the model is optimized
    optional_input: bool = False  # forward(x, bias: Optional[Tensor] = None), given x alone
    # the input at check time beyond the example (``tests.fuzz.probes``): None, "nonfinite",
    # "channels_last", "strided" or "batch"
    probe: str | None = None
    nonfinite: bool = False  # the input has NaN and infinite entries (a probe's input only)

    def values(self) -> list[Value]:
        return [self.input, *(b.out for b in self.blocks)]

    def references(self) -> list[int]:
        """How many times each value is read (by blocks and as an output)."""
        refs = [0] * (len(self.blocks) + 1)
        for b in self.blocks:
            refs[b.src] += 1
            if b.other is not None:
                refs[b.other] += 1
        for k in self.outputs:
            refs[k] += 1
        return refs

    def writes_in_place(self) -> bool:
        """Whether running the model writes any tensor in place (hooks included)."""
        hooks = [*self.root_hooks, *(h for b in self.blocks for h in b.hooks)]
        return any(b.inplace for b in self.blocks) or any(h.name in IN_PLACE_HOOKS for h in hooks)

    def reads_memory_order(self) -> bool:
        """Whether a view-write block goes through ``as_strided`` or a reshape, flatten or view,
        or a flatten block's result may be written in place (docs/pages/capture.md: such a
        method may keep ATen's convolutions, since a prepacked op may return other strides than
        eager's)."""
        views = any(
            b.kind is Kind.VIEW_WRITE
            and any(v[0] in MEMORY_ORDER_VIEWS for v in b.options["views"])
            for b in self.blocks
        )
        flattened = any(b.kind is Kind.FLATTEN for b in self.blocks)
        return views or (flattened and self.writes_in_place())

    def __repr__(self) -> str:
        extras = [f"output_type={self.output_type}"] if self.output_type != "plain" else []
        extras += [f"root_hooks={list(self.root_hooks)}"] if self.root_hooks else []
        extras += [f"global_hook={self.global_hook}"] if self.global_hook else []
        extras += ["cold_cache"] if self.cold_cache else []
        extras += ["optional_input"] if self.optional_input else []
        extras += [f"probe={self.probe}"] if self.probe else []
        lines = [
            f"ModelSpec(input={self.input.__str__().replace('N', str(self.batch), 1)} "
            f"{self.layout.value}, seed={self.seed}{''.join(', ' + e for e in extras)}):"
        ]
        lines += [f"    {b.describe(i)}" for i, b in enumerate(self.blocks)]
        lines.append("    return " + ", ".join(f"v{k}" for k in self.outputs))
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints failing examples with this: the program, not the dataclass."""
        printer.text(repr(self))


# dropout module name -> (class, value ranks it may see: dims of the input)
DROPOUT_MODULES: dict[str, tuple[type[nn.Module], frozenset[int]]] = {
    "Dropout": (nn.Dropout, frozenset({0, 1, 2, 3})),
    "Dropout1d": (nn.Dropout1d, frozenset({1})),
    "Dropout2d": (nn.Dropout2d, frozenset({2})),
    "Dropout3d": (nn.Dropout3d, frozenset({3})),
    "AlphaDropout": (nn.AlphaDropout, frozenset({0, 1, 2, 3})),
    "FeatureAlphaDropout": (nn.FeatureAlphaDropout, frozenset({1, 2, 3})),
}
# functional dropout -> the dims it may see. "F.dropout(p=0)" keeps the default training=True,
# so it really drops in eval mode: p is 0 so that eager stays deterministic.
DROPOUT_FUNCTIONS: dict[str, frozenset[int]] = {
    "F.dropout(training=False)": frozenset({0, 1, 2, 3}),
    "F.dropout(self.training)": frozenset({0, 1, 2, 3}),
    "F.dropout(p=0)": frozenset({0, 1, 2, 3}),
    "F.dropout1d(training=False)": frozenset({1}),
    "F.dropout2d(training=False)": frozenset({2}),
    "F.dropout3d(training=False)": frozenset({3}),
    "F.alpha_dropout": frozenset({0, 1, 2, 3}),
    "F.feature_alpha_dropout": frozenset({1, 2, 3}),
    "torch.dropout(train=False)": frozenset({0, 1, 2, 3}),
    "torch.feature_dropout(train=False)": frozenset({1, 2, 3}),
}


def attr_base(index: int, block: Block) -> str:
    """The attribute prefix of the module or tensors ``block`` (number ``index``) uses."""
    base = f"b{block.owner if block.owner is not None else index}"
    return base + "_alias" if block.options.get("alias") else base


def example_input(spec: ModelSpec, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The model's input, drawn from the spec's seed in its dtype, then (``dtype``) converted
    with its layout kept: a view that reads the memory layout (``as_strided``) must see the
    same elements in the float64 anchor as in eager."""
    gen = torch.Generator().manual_seed(spec.seed)
    shape = spec.input.shape(spec.batch)
    convert = dtype or spec.input.dtype
    if spec.layout is Layout.STRIDED:
        wide = torch.randn(*shape[:-1], 2 * shape[-1], generator=gen, dtype=spec.input.dtype)
        view = wide.to(convert)[..., ::2]
        if spec.nonfinite:
            view.copy_(with_nonfinite(view, gen))
        return view
    x = torch.randn(*shape, generator=gen, dtype=spec.input.dtype).to(convert)
    if spec.nonfinite:
        x = with_nonfinite(x, gen)
    if spec.layout is Layout.CHANNELS_LAST:
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        x = x.contiguous(memory_format=fmt)
    return x


def with_nonfinite(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``x`` with about one entry in eight (at least one) set to NaN, +inf or -inf."""
    flat = x.flatten().clone()
    count = max(1, flat.numel() // 8)
    where = torch.randperm(flat.numel(), generator=generator)[:count]
    kinds = torch.randint(0, 3, (count,), generator=generator)
    specials = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=x.dtype)
    flat[where] = specials[kinds]
    return flat.reshape(x.shape)
