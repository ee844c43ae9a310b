"""What the gate checks the optimized module on, and eager's outputs there.

The example inputs alone cannot show what a capture fixed to them: a branch a trace took on
their values or their layout, a constant it computed from them. So the gate also runs the
optimized module, once each, on two more input sets, built from the example inputs:

- **fresh values**: every floating-point tensor drawn anew with the example's shape, dtype,
  strides and scale (normal, with the example tensor's mean and standard deviation; not
  clamped to its range, whose ends would then come back as they were, and with them a
  constant a trace read from them), NaN and infinities kept where the example has them.
  Integer and bool tensors (token ids, masks) and non-tensor inputs stay as given.
- **another memory layout**: the example's values, each 4-D tensor channels-last (contiguous
  when it was channels-last), every other tensor a non-contiguous strided copy (contiguous
  when it was not).

Each is compared with eager run on the same inputs: the reference is eager's own outputs, so
fresh values cannot fail a correct module. Eager runs each set from the caller's state
(``fxmobile.capture.state``) under one seed, which the gate uses for the optimized module's run
too: a model that draws random numbers in forward draws the same ones in both. A set eager
itself cannot run (a ``.view`` that needs contiguous inputs) is not checked, and the report says
why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from fxmobile.capture.state import model_name, restore_changed, snapshot, state_kept
from fxmobile.verify import reference_outputs, seeded

EXAMPLE = "example inputs"
FRESH = "fresh values"

# How the example inputs become an eager call: (args, kwargs) for the model's forward.
Arguments = Callable[[tuple[Any, ...]], tuple[tuple[Any, ...], dict[str, Any]]]


@dataclass(frozen=True)
class InputSet:
    """Inputs the gate runs the optimized module on, in the form it takes them."""

    name: str  # "example inputs", "fresh values", "channels-last inputs"...
    inputs: tuple[Any, ...]


@dataclass(frozen=True)
class Reference:
    """Eager's side of the gate: the input sets, eager's outputs on each (a tuple of each
    call's outputs where the route's check calls twice), notes on the sets eager could not
    run, and the caller's model, whose state the optimized module keeps through the gate's
    runs (None: eager's outputs came without it)."""

    sets: tuple[InputSet, ...]
    outputs: tuple[Any, ...]
    notes: tuple[str, ...] = ()
    caller: nn.Module | None = None

    @property
    def example(self) -> Any:
        """Eager's outputs on the example inputs."""
        return self.outputs[0]


def input_sets(example_inputs: tuple[Any, ...]) -> tuple[InputSet, ...]:
    """The example inputs, fresh values of their shapes, and their values in another layout
    (a set that would equal the example is left out)."""
    sets = [InputSet(EXAMPLE, example_inputs)]
    generator = torch.Generator().manual_seed(0)
    fresh = pytree.tree_map(lambda x: _fresh(x, generator), example_inputs)
    if _differs(example_inputs, fresh):
        sets.append(InputSet(FRESH, fresh))
    kinds: list[str] = []
    moved = pytree.tree_map(lambda x: _other_layout(x, kinds), example_inputs)
    if kinds:
        sets.append(InputSet(" and ".join(dict.fromkeys(kinds)) + " inputs", moved))
    return tuple(sets)


def _differs(a: Any, b: Any) -> bool:
    """Whether any leaf of ``b`` was made anew (``tree_map`` keeps the ones it returns)."""
    pairs = zip(pytree.tree_leaves(a), pytree.tree_leaves(b), strict=True)
    return any(x is not y for x, y in pairs)


def _fresh(x: Any, generator: torch.Generator) -> Any:
    """A floating tensor drawn anew like ``x`` (see the module's docstring); anything else as
    it is."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
        return x
    values = x.detach().to(torch.float32)
    finite = values[values.isfinite()]
    if finite.numel() == 0:
        return x
    mean = float(finite.mean())
    std = float(finite.std()) if finite.numel() > 1 else 0.0
    spread = std if std > 0 else max(abs(mean), 1.0)
    drawn = torch.randn(x.shape, generator=generator) * spread + mean
    drawn = torch.where(values.isfinite(), drawn, values)
    out = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype)
    try:
        out.copy_(drawn)
    except RuntimeError:  # elements that share memory (an expand): values differ, strides not
        out = drawn.to(x.dtype)
    return out.requires_grad_(x.requires_grad)


def _other_layout(x: Any, kinds: list[str]) -> Any:
    """``x``'s values in another memory layout, its kind appended to ``kinds``; ``x`` itself
    when it has none (a scalar, one element)."""
    if not isinstance(x, torch.Tensor) or x.layout is not torch.strided or x.numel() < 2:
        return x
    if not x.is_contiguous():
        kinds.append("contiguous")
        return x.contiguous()
    if x.dim() == 4:
        moved = x.contiguous(memory_format=torch.channels_last)
        if moved.stride() != x.stride():
            kinds.append("channels-last")
            return moved
    # every other element of a buffer twice as long in the last dimension
    base = torch.empty((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype)
    strided = base[..., ::2]
    if strided.is_contiguous():  # a last dimension of size 1: stride it on the first instead
        base = torch.empty((2 * x.shape[0], *x.shape[1:]), dtype=x.dtype)
        strided = base[::2]
    strided.copy_(x.detach())
    kinds.append("non-contiguous")
    return strided.requires_grad_(x.requires_grad)


def eager_reference(
    model: nn.Module,
    caller: nn.Module,
    example_inputs: tuple[Any, ...],
    arguments: Arguments,
    calls: int = 1,
    after_example: Callable[[], None] | None = None,
) -> tuple[Reference, tuple[Any, ...]]:
    """Eager's outputs on each input set, run on ``model`` (fxmobile's copy of ``caller``, the
    user's model) from the caller's state each time; and the example inputs as eager's call
    left them (a forward may write to its inputs).

    ``after_example`` runs right after the example set's run, before the state is set back (to
    see what the run changed). Eager's failure on the example inputs propagates
    (``InvalidValueError``); on another set, that set is left out with a note."""
    name = model_name(caller)
    sets, outputs, notes = [], [], []
    left: tuple[Any, ...] = ()
    for index, input_set in enumerate(input_sets(example_inputs)):
        before = snapshot(model)
        try:
            with seeded():
                args, kwargs = arguments(input_set.inputs)
                first, after = reference_outputs(model, name, args, kwargs)
                more = [reference_outputs(model, name, args, kwargs)[0] for _ in range(calls - 1)]
        except Exception as exc:
            restore_changed(model, caller, before)
            if index == 0:
                raise
            cause = exc.__cause__ or exc
            line = (str(cause).strip().splitlines() or [""])[0]
            notes.append(
                f"not checked on {input_set.name}: eager's forward fails on them "
                f"({type(cause).__name__}: {line})"
            )
            continue
        if index == 0:
            left = after
            if after_example is not None:
                after_example()
        restore_changed(model, caller, before)
        sets.append(input_set)
        outputs.append(first if calls == 1 else (first, *more))
    return Reference(tuple(sets), tuple(outputs), tuple(notes), caller), left


def run_kept(
    result: Callable[..., Any],
    inputs: Sequence[Any],
    caller: nn.Module | None,
    calls: int,
    run: Callable[[Callable[..., Any], tuple[Any, ...], int], Any],
) -> Any:
    """``run(result, inputs, calls)`` seeded as eager's reference was, with ``result``'s state
    set back to the caller's after."""
    with state_kept(result, caller), seeded():
        return run(result, tuple(inputs), calls)
