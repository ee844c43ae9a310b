"""Evaluating a constant subgraph without side effects: a dispatch mode that refuses, before
they run, random aten ops (tagged ``nondeterministic_seeded``, so the global RNG is never
consumed) and any op that would write to a protected storage (a parameter, a buffer, an earlier
constant), by the written arguments of the op's schema; ``native_batch_norm`` in training mode
writes its running statistics without saying so in its schema and is refused too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from fxmobile.capture.mutation import storage_key

RANDOM = "random op is not a constant"
MUTATES = "op would write to a parameter or constant"


class NotConstantError(Exception):
    """Raised by the guard, before the offending op runs."""


class ConstantGuard(TorchDispatchMode):
    """Refuses random aten ops and writes to ``protected`` storages, before they run."""

    def __init__(self, protected: set[int]) -> None:
        super().__init__()
        self.protected = protected

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            raise NotConstantError(RANDOM)
        # native_batch_norm writes running_mean/var when training, but its schema hides it.
        batch_norm = func is torch.ops.aten.native_batch_norm.default and len(args) > 5
        if batch_norm and args[5] and storages(args[3:5]) & self.protected:
            raise NotConstantError(MUTATES)
        schema = func._schema
        if schema.is_mutable:
            for i, arg in enumerate(schema.arguments):
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                written = arg.alias_info is not None and arg.alias_info.is_write
                if written and storages(value) & self.protected:
                    raise NotConstantError(MUTATES)
        return func(*args, **kwargs)


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors among ``value``'s pytree leaves."""
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            yield leaf


def storages(value: Any) -> set[int]:
    """The storage keys of every tensor in ``value``."""
    return {k for t in tensors(value) if (k := storage_key(t)) is not None}
