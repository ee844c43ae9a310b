"""The caller's model after optimizing: exactly as it was, idioms included.

``tests.test_no_mutation.ModelSnapshot`` compares every tensor, the module tree and the training
flags. The idioms add what a user's model holds beyond tensors: its hooks (the same objects,
in the same order), its caches (the same keys, holding the same tensors), and the tensors the
older ``weight_norm`` / ``spectral_norm`` pre-hooks recompute on every call (replaced by each
eager run, so not compared).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from tests.fuzz.layers import cache_contents
from tests.test_no_mutation import ModelSnapshot, named_tensors


def recomputed_tensors(model: nn.Module) -> frozenset[str]:
    """Qualified names of the tensors the older weight_norm / spectral_norm pre-hooks set
    before every call."""
    return frozenset(
        f"{path}.{hook.name}" if path else hook.name
        for path, module in model.named_modules(remove_duplicate=False)
        for hook in module._forward_pre_hooks.values()
        if isinstance(hook, WeightNorm | SpectralNorm)
    )


def hook_identities(model: nn.Module) -> list[tuple[str, list[int], list[int]]]:
    """Per module, the identity of each forward pre-hook and forward hook, in order."""
    return [
        (path, [id(h) for h in m._forward_pre_hooks.values()], [id(h) for h in hooks.values()])
        for path, m in model.named_modules(remove_duplicate=False)
        for hooks in [m._forward_hooks]
    ]


@dataclass(frozen=True)
class Untouched:
    """What optimizing must leave as it is in the caller's model."""

    snapshot: ModelSnapshot
    ignored: frozenset[str]
    hooks: list[tuple[str, list[int], list[int]]]
    caches: list[tuple[str, list[tuple[str, int]]]]
    keep_alive: Any  # the hooks and cached tensors, so that their ids stay unique

    @classmethod
    def take(cls, model: nn.Module) -> Untouched:
        ignored = recomputed_tensors(model)
        snapshot = ModelSnapshot.take(model)
        kept = {k: v for k, v in snapshot.tensors.items() if k not in ignored}
        alive: list[Any] = [
            (m._forward_pre_hooks.copy(), m._forward_hooks.copy()) for m in model.modules()
        ]
        alive += [getattr(m, "cache", {}).copy() for m in model.modules()]
        return cls(
            ModelSnapshot(kept, snapshot.modules),
            ignored,
            hook_identities(model),
            cache_contents(model),
            alive,
        )

    def assert_unchanged(self, model: nn.Module) -> None:
        now = {name: t for name, t in named_tensors(model) if name not in self.ignored}
        before = self.snapshot.tensors
        assert now.keys() == before.keys(), (
            f"the caller's model gained {sorted(now.keys() - before.keys())} and lost "
            f"{sorted(before.keys() - now.keys())}"
        )
        changed = {name: d for name, state in before.items() if (d := state.differences(now[name]))}
        assert not changed, f"the caller's model was modified: {changed}"
        modules = tuple(
            (name, type(m), m.training) for name, m in model.named_modules(remove_duplicate=False)
        )
        assert modules == self.snapshot.modules, "the caller's module tree or training changed"
        assert hook_identities(model) == self.hooks, "the caller's hooks changed"
        assert cache_contents(model) == self.caches, "the caller's caches changed"
