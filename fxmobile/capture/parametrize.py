"""Parametrizations baked into plain parameters, on fxmobile's copy, before tracing.

A parametrized weight is computed from other tensors on every access: ``W = g * v / ||v||``
(weight norm), ``W / sigma(W)`` (spectral norm, sigma from its stored power-iteration vectors),
an orthogonal map, or any ``torch.nn.utils.parametrize.register_parametrization``. In eval mode
the result does not change from call to call, so each is evaluated once into a plain
parameter, exactly as ``parametrize.remove_parametrizations(..., leave_parametrized=True)``
does; then the layer is an ordinary conv or linear that every pass can fold and prepack.

The copy's injected ``Parametrized<Layer>`` class is replaced by one of its own first: torch's
removal edits that class, which the user's module shares. Both APIs are covered:
``torch.nn.utils.parametrizations.*`` (registered parametrizations) and the older
``torch.nn.utils.weight_norm`` / ``spectral_norm``, which are forward pre-hooks (``WeightNorm`` /
``SpectralNorm``) recomputing ``weight`` before each call; those are removed with torch's own
``remove_weight_norm`` / ``remove_spectral_norm``, which compute the weight without a power
iteration, as eval mode does.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.spectral_norm import SpectralNorm, remove_spectral_norm
from torch.nn.utils.weight_norm import WeightNorm, remove_weight_norm


def recomputed_by_hooks(model: nn.Module) -> frozenset[tuple[str, str]]:
    """(module path, attribute) of the tensors the older weight_norm / spectral_norm pre-hooks
    set before every call: recomputed from parameters, the same each call in eval mode."""
    return frozenset(
        (path, hook.name)
        for path, module in model.named_modules()
        for hook in module._forward_pre_hooks.values()
        if isinstance(hook, WeightNorm | SpectralNorm)
    )


def bake_parametrizations(model: nn.Module) -> Counter[str]:
    """Evaluate every parametrization of ``model`` (fxmobile's eval-mode copy) into a plain
    parameter, in place; how many were baked, by kind (``_WeightNorm``, ``WeightNorm``...)."""
    baked: Counter[str] = Counter()
    with torch.no_grad():
        for module in list(model.modules()):
            if parametrize.is_parametrized(module):
                _own_class(module)
                lists: nn.ModuleDict = module.parametrizations  # type: ignore[assignment]
                for name in list(lists.keys()):
                    for p in lists[name]:  # type: ignore[attr-defined]
                        baked[type(p).__name__] += 1
                    parametrize.remove_parametrizations(module, name, leave_parametrized=True)
            for hook in list(module._forward_pre_hooks.values()):
                if isinstance(hook, WeightNorm):
                    remove_weight_norm(module, hook.name)
                    baked["weight_norm"] += 1
                elif isinstance(hook, SpectralNorm):
                    remove_spectral_norm(module, hook.name)
                    baked["spectral_norm"] += 1
    return baked


def _own_class(module: nn.Module) -> None:
    """Give ``module`` a class of its own before its parametrizations are removed.

    torch injects one ``Parametrized<Layer>`` class per parametrized module, with a property per
    parametrized tensor, and ``remove_parametrizations`` deletes the property from that class.
    ``deepcopy`` shares the class between the user's module and fxmobile's copy, so removing
    from the copy's class would break the user's module.
    """
    cls = type(module)
    module.__class__ = type(cls.__name__, cls.__bases__, dict(cls.__dict__))
