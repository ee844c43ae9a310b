"""fxmobile.passes.user_code: whether the user's own code may read a tensor's strides.

The scan must say "may read" wherever the code, or anything it calls that the scan can follow,
names a layout reader, and wherever it calls something it cannot follow; and "does not" for
code made of arithmetic and torch's own functions and modules, so that channels-last still
runs through a user's plain leaf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.passes.user_code import may_read_layout


def _stride_of(t: torch.Tensor) -> int:
    return t.stride(0)


def _plain(t: torch.Tensor) -> torch.Tensor:
    return F.relu(t) * 2 + torch.cat([t, t], 1).sum(1, keepdim=True)


def _recursive(t: torch.Tensor, n: int = 2) -> torch.Tensor:
    return t if n == 0 else _recursive(t + 1, n - 1)


class _Opaque:
    """An object of a user's class: the scan cannot tell what calling it does."""

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t


_OPAQUE = _Opaque()


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.act = nn.Sequential(nn.ReLU(), nn.Hardswish())
        self.scale = 2.0
        self.k = 1  # a one-letter attribute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _recursive(_plain(self.act(self.conv(x)) * self.scale)) + self.k


class ReadsDirectly(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.is_contiguous() else x - 1


class ThroughAGlobalFunction(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * _stride_of(x)


class ThroughAMethod(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._helper(x)

    def _helper(self, x: torch.Tensor) -> torch.Tensor:
        return x + x.data_ptr() % 2


class ThroughAProperty(nn.Module):
    @property
    def channels_last(self) -> bool:
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last)


class ThroughASubmodule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.ReLU(), ReadsDirectly())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class ThroughAnAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fn = _stride_of

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.fn(x)


class ThroughAPrivateAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self._fn = _stride_of

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self._fn(x)


_CONFIG: dict[str, Any] = {
    "scale": 2.0, "dtype": torch.float32, "is_tensor": torch.is_tensor, "max": max
}  # fmt: skip


def _configured(t: torch.Tensor) -> torch.Tensor:
    """Globals of plain data, torch's objects and builtins: nothing of the user's runs."""
    scale = _CONFIG["scale"]
    assert _CONFIG["is_tensor"](t) and t.dtype == _CONFIG["dtype"]
    return t * _CONFIG["max"](scale, 1.0)


class ThroughAnOpaqueObject(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _OPAQUE(x)


class ThroughGetattr(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * getattr(x, "stri" + "de")(0)


def _closure() -> Callable[[torch.Tensor], torch.Tensor]:
    def inner(t: torch.Tensor) -> torch.Tensor:
        return t * _stride_of(t)

    def outer(t: torch.Tensor) -> torch.Tensor:
        return inner(t)

    return outer


class _Helpers:
    """A user's class, its methods of every kind reading strides."""

    @staticmethod
    def static(t: torch.Tensor) -> int:
        return t.stride(0)

    @classmethod
    def of_class(cls, t: torch.Tensor) -> int:
        return t.stride(0)

    def bound(self, t: torch.Tensor) -> int:
        return t.stride(0)


class ThroughAStaticmethod(nn.Module):
    _s = staticmethod(_Helpers.static)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self._s(x)


class ThroughAClassmethod(nn.Module):
    _c = _Helpers.__dict__["of_class"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self._c(x)


class ThroughABoundMethod(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fn = _Helpers().bound

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.fn(x)


class ThroughAUsersClass(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * _Helpers.static(x)


class ThroughAPropertysGetter(nn.Module):
    table: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.ones(2, 2))

    @property
    def ready(self) -> bool:
        return self.table.is_contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if self.ready else x


_GLOBAL_BLOCK = ReadsDirectly()


class ThroughAGlobalModule(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GLOBAL_BLOCK(x)


class ThroughAGenerator(nn.Module):
    """The read sits in a function only a nested code object (the generator expression's)
    calls, not forward's own code."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * sum(_stride_of(t) for t in (x,))


def _shadowing_a_builtin() -> Callable[[torch.Tensor], torch.Tensor]:
    """A user's function named like a builtin (``len``), in the globals of the code calling it."""
    namespace: dict[str, object] = {"len": _stride_of}
    exec("def scaled(t):\n    return t * len(t)\n", namespace)
    function = namespace["scaled"]
    assert callable(function)
    return function


def _with_an_empty_cell() -> Callable[[torch.Tensor], torch.Tensor]:
    """A closure over a name assigned only after it is returned: its cell is empty."""

    later: Callable[[torch.Tensor], int]

    def inner(t: torch.Tensor) -> torch.Tensor:
        return t * later(t)

    return inner
    later = _stride_of


class ClassAttributeNamedLikeAGlobal(nn.Module):
    """``self._stride_of`` is harmless; the global ``_stride_of`` forward also calls is not."""

    _stride_of = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self._stride_of * _stride_of(x)


_HOLDS_ITSELF: list[Any] = [1.0]
_HOLDS_ITSELF.append(_HOLDS_ITSELF)


def _reads_a_list_that_holds_itself(t: torch.Tensor) -> torch.Tensor:
    return t * len(_HOLDS_ITSELF)


class Hooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Identity()
        self.inner.register_forward_hook(lambda m, a, o: o)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


@pytest.mark.parametrize(
    "target",
    [ReadsDirectly(), ThroughAGlobalFunction(), ThroughAMethod(), ThroughAProperty(),
     ThroughASubmodule(), ThroughAnAttribute(), ThroughAnOpaqueObject(), ThroughGetattr(),
     Hooked(), _stride_of, _closure(), ThroughAStaticmethod(), ThroughAClassmethod(),
     ThroughABoundMethod(), ThroughAUsersClass(), ThroughAPropertysGetter(),
     ThroughAGlobalModule(), ThroughAGenerator(), _shadowing_a_builtin(),
     ThroughAPrivateAttribute(), ClassAttributeNamedLikeAGlobal()],
    ids=["directly", "global function", "method", "property", "submodule", "attribute",
         "opaque object", "getattr", "hooked submodule", "function", "closure", "staticmethod",
         "classmethod", "bound method", "user's class", "property getter", "global module",
         "generator expression", "shadowed builtin", "private attribute",
         "global behind a class attribute"],
)  # fmt: skip
def test_code_that_may_read_strides_is_found(target: nn.Module | Callable[..., object]) -> None:
    assert may_read_layout(target)


@pytest.mark.parametrize(
    "target",
    [Plain(), nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU()), _plain, _recursive, F.relu,
     _with_an_empty_cell(), _configured, _reads_a_list_that_holds_itself],
    ids=["user module", "torch modules", "function", "recursive function", "torch function",
         "empty closure cell", "globals of data, torch and builtins", "list holding itself"],
)  # fmt: skip
def test_code_of_arithmetic_and_torch_calls_reads_no_strides(
    target: nn.Module | Callable[..., object],
) -> None:
    assert not may_read_layout(target)
