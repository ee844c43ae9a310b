"""The example inputs in other memory layouts: what a trace or an export must get right too.

A traced or exported graph holds the branch the example inputs took, and neither
``torch.jit.trace`` nor ``torch.export`` says so for a branch on a memory layout
(``if y.is_contiguous():``, ``if x.stride(-1) != 1``): the example's values answer nothing there,
its strides do. ``other_layouts`` gives the example inputs again, the same values in other
strides:

- **channels-last**: each 4-D floating tensor in the other of its two dense layouts
  (channels-last for a contiguous one, contiguous for a channels-last one);
- **non-contiguous**: each tensor of more than one element as every other element of a buffer
  twice as long in its last dimension (``buffer[..., ::2]``).

A variant that changes no tensor's strides (no 4-D floating input) is left out.

``layout_dependence`` runs a model on the example inputs and on each variant: where the outputs
differ, the model computes something else for another layout, which one graph of fixed branches
(an ExecuTorch program, whose inputs are made contiguous) cannot do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from fxmobile.capture.checks import deep_copy
from fxmobile.errors import InvalidValueError
from fxmobile.verify import clone_inputs, compare_outputs

CHANNELS_LAST = "channels-last copies of the example inputs"
NON_CONTIGUOUS = "non-contiguous copies of the example inputs"


def other_layouts(inputs: tuple[Any, ...]) -> list[tuple[str, tuple[Any, ...]]]:
    """(what it is, the inputs) for each layout variant of ``inputs`` that changes a tensor."""
    variants = []
    for label, convert in ((CHANNELS_LAST, _other_dense), (NON_CONTIGUOUS, _strided)):
        changed = False

        def one(
            value: Any, convert: Callable[[torch.Tensor], torch.Tensor | None] = convert
        ) -> Any:
            nonlocal changed
            if not isinstance(value, torch.Tensor):
                return value
            converted = convert(value)
            if converted is None or converted.stride() == value.stride():
                return value
            changed = True
            return converted

        variant = pytree.tree_map(one, inputs)
        if changed:
            variants.append((label, variant))
    return variants


def _other_dense(tensor: torch.Tensor) -> torch.Tensor | None:
    if tensor.dim() != 4 or not tensor.is_floating_point() or tensor.layout is not torch.strided:
        return None
    if tensor.is_contiguous():
        return tensor.contiguous(memory_format=torch.channels_last)
    if tensor.is_contiguous(memory_format=torch.channels_last):
        return tensor.contiguous()
    return None


def _strided(tensor: torch.Tensor) -> torch.Tensor | None:
    if tensor.dim() == 0 or tensor.numel() < 2 or tensor.layout is not torch.strided:
        return None
    *outer, last = tensor.shape
    buffer = torch.zeros(*outer, 2 * last, dtype=tensor.dtype, device=tensor.device)
    view = buffer[..., ::2]
    view.copy_(tensor)
    return view


def layout_dependence(
    model: nn.Module, inputs: tuple[Any, ...], tolerance: float | None
) -> str | None:
    """The first layout variant on which ``model`` (a copy of it per run, each from the same
    random seed) returns other outputs than on ``inputs`` (beyond ``tolerance`` of their scale,
    by dtype when None), or None when its outputs do not depend on its inputs' layout."""
    expected = _run(model, inputs)
    for label, variant in other_layouts(inputs):
        try:
            got = _run(model, variant)
        except Exception:  # eager refuses the layout (a view that needs contiguous memory)
            continue
        try:
            same = all(check.passed for check in compare_outputs(expected, got, tolerance))
        except InvalidValueError:  # another structure, or another shape
            same = False
        if not same:
            return label
    return None


def _run(model: nn.Module, inputs: tuple[Any, ...]) -> Any:
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(0)
        return deep_copy(model)(*clone_inputs(inputs))
