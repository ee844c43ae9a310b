"""Layers as users write them, for the fuzzer: parametrized weights, subclassed layers that
override ``forward``, and caches filled in ``forward``.

- **parametrizations** (docs/pages/capture.md: evaluated once, in eval mode, into plain
  parameters; the layer then folds and prepacks):
  ``torch.nn.utils.parametrizations.weight_norm``, ``spectral_norm``, ``orthogonal`` (square
  weights only), a custom ``register_parametrization`` (on the weight or the bias, alone or
  stacked on another), and the older ``torch.nn.utils.weight_norm`` / ``spectral_norm``
  pre-hooks;
- **subclasses**: ``class MyConv2d(nn.Conv2d)`` whose ``forward`` does extra work after the
  layer's own (scale, shift, relu) or computes with a reweighted weight;
- **caches**: a dict attribute filled on the first call (``CachedScale``), and timm LeViT's
  ``attention_bias_cache`` keyed by device and skipped while tracing (``CachedBias``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations, parametrize
from torch.nn.utils.spectral_norm import SpectralNorm


class ScaleWeight(nn.Module):
    """A custom parametrization: the tensor times a constant."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * self.factor


class Softsign(nn.Module):
    """A custom parametrization that bounds the tensor: ``w / (1 + |w|)``."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w / (1 + w.abs())


def _old_spectral_norm(layer: nn.Module) -> None:
    """``torch.nn.utils.spectral_norm``, with the power iteration a training run would have
    done: in eval mode its pre-hook divides by ``u . W v`` from the stored vectors, which are
    random until then (a near-zero sigma would blow the weight up)."""
    torch.nn.utils.spectral_norm(layer)
    (hook,) = [h for h in layer._forward_pre_hooks.values() if isinstance(h, SpectralNorm)]
    with torch.no_grad():
        for _ in range(20):
            hook.compute_weight(layer, do_power_iteration=True)
        setattr(layer, hook.name, hook.compute_weight(layer, do_power_iteration=False))


def _old_weight_norm(layer: nn.Module) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch prefers the parametrization
        torch.nn.utils.weight_norm(layer)


PARAMETRIZATIONS: dict[str, Any] = {
    "weight_norm": lambda layer: parametrizations.weight_norm(layer),
    "spectral_norm": lambda layer: parametrizations.spectral_norm(layer),
    "orthogonal": lambda layer: parametrizations.orthogonal(layer),
    "old_weight_norm": _old_weight_norm,
    "old_spectral_norm": _old_spectral_norm,
    "scale": lambda layer: parametrize.register_parametrization(layer, "weight", ScaleWeight(1.5)),
    "softsign": lambda layer: parametrize.register_parametrization(layer, "weight", Softsign()),
    "scale_bias": lambda layer: parametrize.register_parametrization(
        layer, "bias", ScaleWeight(-0.5)
    ),
}
NEW_API = ("weight_norm", "spectral_norm", "orthogonal", "scale", "softsign", "scale_bias")


def parametrize_layer(layer: nn.Module, names: tuple[str, ...]) -> None:
    """Apply the parametrizations ``names`` to ``layer``, in order."""
    for name in names:
        PARAMETRIZATIONS[name](layer)


class Extra:
    """Mixed into a torch.nn layer: ``forward`` runs the layer's own, then ``self.extra``."""

    extra: str
    gain: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra == "reweight":
            return self.reweighted(x)
        y = super().forward(x)  # type: ignore[misc]
        if self.extra == "scale":
            return y * self.gain
        if self.extra == "shift":
            return y + self.gain
        return F.relu(y)

    def reweighted(self, x: torch.Tensor) -> torch.Tensor:
        """The layer computed with ``weight * gain`` (convs and linears only)."""
        weight = self.weight * self.gain  # type: ignore[attr-defined]
        if isinstance(self, nn.Linear):
            return F.linear(x, weight, self.bias)
        return self._conv_forward(x, weight, self.bias)  # type: ignore[attr-defined]


_BASES: tuple[type[nn.Module], ...] = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
    nn.Linear, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.ReLU, nn.ReLU6, nn.Hardtanh,
    nn.Hardswish,
)  # fmt: skip
# nn.Conv2d -> class MyConv2d(Extra, nn.Conv2d): module-level classes (deep-copyable, picklable)
SUBCLASSES: dict[type[nn.Module], type[nn.Module]] = {}
for _base in _BASES:
    _cls = type(f"My{_base.__name__}", (Extra, _base), {"__module__": __name__})
    _cls.__qualname__ = _cls.__name__
    globals()[_cls.__name__] = SUBCLASSES[_base] = _cls
SUBCLASS_EXTRAS = ("scale", "shift", "relu", "reweight")
REWEIGHTABLE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def subclassed(layer: nn.Module, extra: str, gain: float) -> nn.Module:
    """``layer`` as an instance of its ``My*`` subclass doing ``extra`` (the same tensors)."""
    layer.__class__ = SUBCLASSES[type(layer)]
    layer.extra = extra  # type: ignore[assignment]
    layer.gain = gain  # type: ignore[assignment]
    return layer


class CachedScale(nn.Module):
    """``x * s`` (or ``x + s``) where ``s``, computed from a parameter, is cached in a dict the
    first time ``forward`` runs."""

    def __init__(self, shape: tuple[int, ...], op: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(shape, dtype=dtype))
        self.op = op
        self.cache: dict[str, torch.Tensor] = {}

    def scale(self) -> torch.Tensor:
        if "scale" not in self.cache:
            self.cache["scale"] = torch.tanh(self.weight) + 1.5
        return self.cache["scale"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale() if self.op == "mul" else x + self.scale()


class CachedBias(nn.Module):
    """timm LeViT's attention-bias cache: a gathered bias, cached per device in eval mode and
    recomputed while tracing (``torch.jit.is_tracing()``) or training."""

    def __init__(self, channels: int, spatial: tuple[int, ...], dtype: torch.dtype) -> None:
        super().__init__()
        points = 4
        self.biases = nn.Parameter(torch.randn(channels, points, dtype=dtype))
        self.idxs: torch.Tensor
        self.register_buffer("idxs", torch.randint(0, points, spatial), persistent=False)
        self.cache: dict[str, torch.Tensor] = {}

    def get_bias(self, device: torch.device) -> torch.Tensor:
        if torch.jit.is_tracing() or self.training:
            return self.biases[:, self.idxs]
        key = str(device)
        if key not in self.cache:
            self.cache[key] = self.biases[:, self.idxs]
        return self.cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.get_bias(x.device)


CACHES = (CachedScale, CachedBias)


def clear_caches(model: nn.Module) -> None:
    """Empty every cache, as in a model that has not run yet."""
    for module in model.modules():
        if isinstance(module, CACHES):
            module.cache.clear()


def cache_contents(model: nn.Module) -> list[tuple[str, list[tuple[str, int]]]]:
    """Each cache's keys and the identity of what it holds (optimizing must not change them)."""
    return [
        (path, [(key, id(value)) for key, value in module.cache.items()])
        for path, module in model.named_modules()
        if isinstance(module, CACHES)
    ]
