"""Folding a per-output-channel affine map into a conv, transposed conv or linear layer.

For a producer ``y = W * x + b`` followed by ``z = y * s + t`` (``s``, ``t`` per output channel):

    W'[o] = W[o] * s[o]
    b'[o] = b[o] * s[o] + t[o]        (b = 0 when the producer has no bias; it gains one)

The arithmetic is done in float64 and written back in the producer's own dtype. The output
channel is axis 0 of a conv or linear weight (``[out, in/groups, *k]``), but a transposed conv
stores ``[in, out/groups, *k]``: output channel ``o = g * (out/groups) + j`` lives at group
``g``, column ``j`` of axis 1 (the axis upstream got wrong, pytorch/pytorch#180995).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

CONV_TYPES: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
CONV_TRANSPOSE_TYPES: tuple[type[nn.Module], ...] = (
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)
PRODUCER_TYPES: tuple[type[nn.Module], ...] = (*CONV_TYPES, *CONV_TRANSPOSE_TYPES, nn.Linear)


def is_producer(module: nn.Module) -> bool:
    """Exactly one of the layer types an affine map folds into (subclasses may override forward)."""
    return type(module) in PRODUCER_TYPES


def out_channels(module: nn.Module) -> int:
    """How many output channels ``module`` has (``out_features`` for a Linear)."""
    if type(module) is nn.Linear:
        return int(module.out_features)
    return int(module.out_channels)  # type: ignore[arg-type]


# Rows of the weight scaled per step: about 2 MB of float64 at a time, so the float64
# temporaries stay in cache instead of costing four weight-sized allocations (resnet50's
# BatchNorm folds: 500 MB of fresh memory and 45-130 ms, against about 10 ms).
_BLOCK_ELEMENTS = 1 << 18


def scale_output_channels(
    weight: torch.Tensor, scale: torch.Tensor, *, transposed: bool, groups: int
) -> torch.Tensor:
    """``weight`` times ``scale`` (float64, one per output channel), each product computed in
    float64 and rounded once to ``weight``'s dtype; a new contiguous tensor."""
    w = weight.detach()
    if not transposed:
        s = scale.reshape(-1, *([1] * (w.dim() - 1)))
    else:
        # row r of a transposed weight is input channel r, in group r // (in/groups): its
        # output channels are that group's slice of scale, along axis 1
        in_ch, out_per_group = w.shape[0], w.shape[1]
        per_group = scale.reshape(groups, 1, out_per_group, *([1] * (w.dim() - 2)))
        s = per_group.expand(groups, in_ch // groups, *per_group.shape[2:]).reshape(
            in_ch, out_per_group, *per_group.shape[3:]
        )
    out = torch.empty(w.shape, dtype=w.dtype, device=w.device)
    rows = max(1, _BLOCK_ELEMENTS // max(1, w[0].numel())) if len(w) else 1
    for start in range(0, len(w), rows):
        block = slice(start, start + rows)
        out[block] = w[block].to(torch.float64) * s[block]
    return out


def _copy_without_tensors(module: nn.Module) -> nn.Module:
    """A new module object sharing ``module``'s tensors; assigning weight/bias on it leaves
    ``module`` as it was (a deep copy would clone the weight only to replace it)."""
    folded = copy.copy(module)
    folded._parameters = dict(module._parameters)
    folded._buffers = dict(module._buffers)
    folded._modules = dict(module._modules)
    return folded


def fold_affine_into(module: nn.Module, scale: torch.Tensor, shift: torch.Tensor) -> nn.Module:
    """A new producer computing ``module(x) * scale + shift``; ``module`` itself is untouched.

    ``scale`` and ``shift`` are float64 vectors with one entry per output channel.
    """
    if not is_producer(module):
        raise TypeError(f"cannot fold an affine map into {type(module).__name__}")
    n = out_channels(module)
    if scale.shape != (n,) or shift.shape != (n,):
        raise ValueError(
            f"scale/shift must have {n} entries, got {tuple(scale.shape)}/{tuple(shift.shape)}"
        )
    folded = _copy_without_tensors(module)
    weight: torch.Tensor = module.weight  # type: ignore[assignment]
    transposed = type(module) in CONV_TRANSPOSE_TYPES
    groups = int(getattr(module, "groups", 1))
    new_w = scale_output_channels(weight, scale, transposed=transposed, groups=groups)
    bias = module.bias
    b = (
        bias.detach().to(torch.float64)
        if isinstance(bias, torch.Tensor)
        else torch.zeros(n, dtype=torch.float64)
    )
    new_b = b * scale + shift
    folded.weight = nn.Parameter(new_w, requires_grad=weight.requires_grad)
    folded.bias = nn.Parameter(new_b.to(weight.dtype), requires_grad=weight.requires_grad)
    return folded
