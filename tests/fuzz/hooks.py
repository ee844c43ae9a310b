"""Module hooks as users write them, for the fuzzer: what each drawn ``HookSpec`` registers.

Two families, told apart by the hook rule of docs/pages/capture.md#hooks ("a hook whose code
provably changes nothing but its result (a plain function: no attribute, item, global or
closure stores, no ``append``-like calls, reading only torch, ``math`` and immutable values)
is traced into the graph"; any other stays with its module and runs at run time):

- **pure**: plain functions closing over a float: scale or shift the output, ``relu`` it,
  scale it in place (``out.mul_(c)``, returning None), rescale the input in a pre-hook (also in
  place: ``args[0].mul_(c)``), and the ``with_kwargs`` forms;
- **stateful**: a ``Recorder`` object that logs the shapes it sees, a counter (a plain function
  that increments a global), a bound method and a ``functools.partial`` that scale the output.

``hook_calls`` measures what the stateful ones saw during one call: in the optimized FX module
they must see exactly what they saw in eager (the optimized module calls the user's hook objects).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as module_globals

from tests.fuzz.spec import FORWARD_HOOKS, PURE_HOOKS, STATEFUL_HOOKS, HookSpec

# calls counted by the counter hooks, in every model (reset by ``hook_calls``)
CALLS = {"count": 0}

Hook = Callable[..., Any]


class Recorder:
    """A stateful hook, as feature-extraction code writes it: logs what it sees."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[tuple[str, tuple[int, ...], torch.dtype]] = []

    def __call__(self, module: nn.Module, args: tuple[Any, ...], *rest: Any) -> None:
        watched = rest[-1] if rest and isinstance(rest[-1], torch.Tensor) else args[0]
        self.seen.append((self.name, tuple(watched.shape), watched.dtype))


class Scaler:
    """Its bound method is a hook: an object the hook could change, so it is not traced."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def scale(self, module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        return out * self.factor


def _partial_scale(factor: float, module: nn.Module, args: Any, out: torch.Tensor) -> Any:
    return out * factor


def _scale(c: float) -> Hook:
    def scale(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        return out * c

    return scale


def _shift(c: float) -> Hook:
    def shift(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        return out + c

    return shift


def _relu(c: float) -> Hook:
    def relu(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        return torch.relu(out)

    return relu


def _scale_in_place(c: float) -> Hook:
    def scale_in_place(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
        out.mul_(c)  # the write is the hook's effect; it returns nothing

    return scale_in_place


def _kwargs_shift(c: float) -> Hook:
    def kwargs_shift(module: nn.Module, args: Any, kwargs: Any, out: torch.Tensor) -> Any:
        return out - c

    return kwargs_shift


def _pre_scale(c: float) -> Hook:
    def pre_scale(module: nn.Module, args: tuple[Any, ...]) -> Any:
        return (args[0] * c,)

    return pre_scale


def _pre_scale_in_place(c: float) -> Hook:
    def pre_scale_in_place(module: nn.Module, args: tuple[Any, ...]) -> None:
        args[0].mul_(c)  # writes the module's input: an earlier value, or the model's input

    return pre_scale_in_place


def _pre_kwargs_shift(c: float) -> Hook:
    def pre_kwargs_shift(module: nn.Module, args: Any, kwargs: Any) -> Any:
        return (args[0] + c, *args[1:]), kwargs

    return pre_kwargs_shift


def _counter(c: float) -> Hook:
    def counter(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        CALLS["count"] += 1
        return out + c

    return counter


# name -> (which hook registration, factory of the hook from its constant)
HOOKS: dict[str, tuple[str, Callable[[float], Hook]]] = {
    "scale": ("forward", _scale),
    "shift": ("forward", _shift),
    "relu": ("forward", _relu),
    "scale_in_place": ("forward", _scale_in_place),
    "kwargs_shift": ("forward_kwargs", _kwargs_shift),
    "pre_scale": ("pre", _pre_scale),
    "pre_scale_in_place": ("pre", _pre_scale_in_place),
    "pre_kwargs_shift": ("pre_kwargs", _pre_kwargs_shift),
    # stateful: kept with their module
    "recorder": ("forward", lambda c: Recorder("forward")),
    "pre_recorder": ("pre", lambda c: Recorder("pre")),
    "counter": ("forward", _counter),
    "bound_scale": ("forward", lambda c: Scaler(c).scale),
    "partial_scale": ("forward", lambda c: functools.partial(_partial_scale, c)),
}
assert set(HOOKS) == {*PURE_HOOKS, *STATEFUL_HOOKS}
assert {n for n, (where, _) in HOOKS.items() if where.startswith("forward")} == set(FORWARD_HOOKS)


def register_hooks(module: nn.Module, hooks: tuple[HookSpec, ...]) -> None:
    """Register each of ``hooks`` on ``module``, in order."""
    for spec in hooks:
        where, make = HOOKS[spec.name]
        hook = make(spec.constant)
        if where.startswith("pre"):
            module.register_forward_pre_hook(hook, with_kwargs=where == "pre_kwargs")
        else:
            module.register_forward_hook(hook, with_kwargs=where == "forward_kwargs")


def recorders(model: nn.Module) -> list[Recorder]:
    """The ``Recorder`` hooks registered on ``model`` and its submodules, once each."""
    found: dict[int, Recorder] = {}
    for module in model.modules():
        for hook in [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]:
            if isinstance(hook, Recorder):
                found[id(hook)] = hook
    return list(found.values())


def hook_calls(model: nn.Module, call: Callable[[], object]) -> tuple[list[Any], int]:
    """What ``model``'s stateful hooks saw during ``call()``: each recorder's log, and the
    counter hooks' count."""
    watched = recorders(model)
    for recorder in watched:
        recorder.seen.clear()
    CALLS["count"] = 0
    call()
    return [list(r.seen) for r in watched], CALLS["count"]


def _global_recorder(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
    CALLS["count"] += 1


def _global_pre_scale(module: nn.Module, args: tuple[Any, ...]) -> None:
    return None


GLOBAL_HOOKS: dict[str, Callable[[Hook], Any]] = {
    "forward": lambda hook: module_globals.register_module_forward_hook(hook),
    "pre": lambda hook: module_globals.register_module_forward_pre_hook(hook),
}


@contextlib.contextmanager
def global_hook(kind: str | None) -> Iterator[None]:
    """While active, torch's global module hook ``kind`` ("forward" or "pre") is registered."""
    if kind is None:
        yield
        return
    hook = _global_recorder if kind == "forward" else _global_pre_scale
    handle = GLOBAL_HOOKS[kind](hook)
    try:
        yield
    finally:
        handle.remove()
