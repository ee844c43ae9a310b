"""The one memory layout of the tensors an ExecuTorch program is made from and run on.

ExecuTorch records each tensor's layout as a dim order: its dims sorted by stride, read off the
strides the tensor has at export. torch ignores the stride of a dim of size 1, so one layout has
many spellings, and ExecuTorch reads some of them as another layout:

- a constant of shape ``(1, 1, 49, 49)`` and strides ``(1, 1, 49, 1)`` (Swin's relative-position
  bias with one head, folded: the ``permute(2, 0, 1)`` it was made by leaves those strides, and
  torch calls them contiguous, so ``.contiguous()`` keeps them) is given dim order
  ``(2, 0, 1, 3)``, and XNNPACK's delegate fails to run the program ("Propagating input shapes
  failed"), in ExecuTorch's own flow too;
- an example input of such strides, or in channels-last memory, makes a program whose input has
  that dim order: it fails on contiguous inputs, or reads them as channels-last and computes
  something else.

``canonical`` spells every tensor the one way (the strides ``torch.empty`` gives its shape).
It moves elements only where the strides order them otherwise; the values at each index are
the same, so the program computes what the module does. ``contiguous_attributes`` does so for
every tensor a module holds before fxmobile exports it (ExecuTorch's own flow, as the zoo and
the benchmark run it, exports the model as it is), and the runner for every input.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree


def contiguous_strides(shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a new contiguous tensor of ``shape`` (row-major, empty dims as 1)."""
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def canonical(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when its strides are ``contiguous_strides`` of its shape, else a copy
    with them (a dense tensor only; a sparse or nested one is returned as it is)."""
    if tensor.layout is not torch.strided or tensor.stride() == contiguous_strides(tensor.shape):
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def contiguous_inputs(inputs: Any) -> Any:
    """``inputs`` (any structure of tensors and other values) with each tensor ``canonical``;
    the tensors given are left as they are."""
    return pytree.tree_map(lambda v: canonical(v) if isinstance(v, torch.Tensor) else v, inputs)


def contiguous_attributes(module: nn.Module) -> int:
    """Give every parameter, buffer and tensor attribute of ``module`` and its submodules the
    strides ``contiguous`` gives, as a new tensor set in its place (the old tensor is left as
    it was, for whoever else holds it); one tensor held in several places stays one. ``module``
    must be fxmobile's own copy: its attributes are replaced. Returns how many tensors were."""
    replaced: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (old, new): old kept alive
    for sub in module.modules():
        slots: list[dict[str, Any]] = [sub._parameters, sub._buffers, vars(sub)]
        for slot in slots:
            for name, value in list(slot.items()):
                if not isinstance(value, torch.Tensor):
                    continue
                if id(value) not in replaced:
                    new = _restrided(value)
                    if new is value:
                        continue
                    replaced[id(value)] = value, new
                slot[name] = replaced[id(value)][1]
    return len(replaced)


def _restrided(value: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        data = canonical(value)
    if data is not value and isinstance(value, nn.Parameter):
        return nn.Parameter(data, requires_grad=value.requires_grad)
    return data
