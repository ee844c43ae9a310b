"""Random numbers and seeds at capture time: recorded as graph nodes, or refused.

torch.fx traces forward by running it once on proxies. A call with no traced argument runs then,
for real, and its result becomes a constant of the graph: ``torch.randn(1, 8, 1, 1)`` is drawn
once and baked in, where eager draws new values on every call (the shape-aware route makes more
calls so: ``torch.randn(x.shape[0], 8)`` has a concrete size there). A seed call
(``torch.manual_seed(123)``) runs at trace time as well, and leaves nothing in the graph.

While fxmobile's tracer runs (``recording_random_calls``):

- each random function of torch's namespace (``fxmobile.ops.random_functions``: ``torch.randn``,
  ``torch.rand``, ``torch.randint``, ``torch.randperm``, ``torch.normal``, ``torch.bernoulli``...)
  records a ``call_function`` node whatever its arguments, so the graph draws on every call, as
  eager does;
- a random op that still runs for real (on a tensor made at trace time:
  ``torch.zeros(3).normal_()``, or a random function imported by name) fails the route with
  ``RandomAtTraceTimeError`` before its values can be baked in; the routes that run forward as it
  is take the model instead (an automatic leaf, or ``torch.jit.trace``, which records every op);
- a seed call (``fxmobile.ops.rng_state_functions``: ``torch.manual_seed``, ``torch.seed``,
  ``torch.set_rng_state``) and a ``generator=`` argument are refused with ``RefusedError``, which
  no other route takes either: torch.fx and torch.export run a seed call once, while tracing,
  torch.jit.trace records none, and no graph holds a generator object.

``refusing_rng_state_calls`` refuses the seed calls alone, around a run that records the ops
itself (``torch.jit.trace``; ``torch.export``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

from fxmobile import ops
from fxmobile.errors import RefusedError, innermost_user_frame

# Where torch's global generator is seeded or set from: ``torch.manual_seed`` is
# ``torch.random.manual_seed`` (once torch._dynamo is imported, a wrapper of it), and code calls
# it by either name.
_RNG_NAMESPACES = (torch, torch.random)


class RandomAtTraceTimeError(RuntimeError):
    """A random op ran on real tensors while torch.fx traced: its values would be baked in."""


@contextlib.contextmanager
def recording_random_calls(tracer: fx.Tracer) -> Iterator[None]:
    """While tracing with ``tracer``: random functions of torch record nodes, a random op that
    runs for real raises ``RandomAtTraceTimeError``, and seed calls are refused."""

    def owner() -> str:
        return type(getattr(tracer, "root", None)).__name__

    recorded = [(torch, name, _recorded(tracer, name, owner)) for name in ops.random_functions()]
    with _patched(recorded + _seed_refusals(owner)), _RandomWork(tracer):
        yield


@contextlib.contextmanager
def refusing_rng_state_calls(name: str) -> Iterator[None]:
    """``RefusedError`` when code outside torch seeds or sets torch's global generator in the
    block (``name`` is the model's, for the message)."""
    with _patched(_seed_refusals(lambda: name)):
        yield


def seed_call_error(model: str, call: str, where: str | None) -> RefusedError:
    """The refusal of a forward that seeds or sets torch's global generator."""
    at = f" at {where}" if where else ""
    return RefusedError(
        f"{model}.forward calls {call}{at}: it sets torch's global random number generator on "
        f"every call, which no optimized module does as eager does (torch.fx and torch.export "
        f"run the call once, while tracing, and torch.jit.trace records none). Fix: seed once "
        f"before calling the model, outside forward; or, if forward must add the same noise on "
        f"every call, draw it once in __init__ and keep it as a buffer "
        f"(self.register_buffer('noise', torch.randn(...)))."
    )


def generator_error(model: str, call: str, where: str | None) -> RefusedError:
    """The refusal of a forward that draws from a generator object of its own."""
    at = f" at {where}" if where else ""
    return RefusedError(
        f"{model}.forward passes a torch.Generator to {call}{at}: an optimized module cannot "
        f"hold a generator object, so it would draw other values than eager does. Fix: draw from "
        f"torch's global generator (drop generator=; seed it once, outside forward, for "
        f"reproducible values), or draw the values once in __init__ and keep them as a buffer."
    )


def unused_draw_error(model: str, call: str) -> RefusedError:
    """The refusal of a forward that draws random numbers it never uses, on a route through
    TorchScript: its dead-code elimination takes the draw for pure and drops it (fuzz finding
    F14)."""
    return RefusedError(
        f"{model}.forward draws random numbers it never uses ({call}): TorchScript drops an "
        f"unused draw, so every draw after it, and torch's global generator after each call, "
        f"would differ from eager's. Fix: remove the unused draw; or, to keep it, take the FX "
        f"stage's module (fxmobile.optimize_fx), which keeps every draw."
    )


def _recorded(tracer: fx.Tracer, name: str, owner: Callable[[], str]) -> Callable[..., Any]:
    """``torch.<name>`` recording a node on ``tracer``; the function itself while a fake value is
    computed (the shape-aware tracer runs each recorded op on fake tensors)."""
    original = getattr(torch, name)

    @functools.wraps(original)
    def record(*args: Any, **kwargs: Any) -> Any:
        if getattr(tracer, "computing", False):
            return original(*args, **kwargs)
        if kwargs.get("generator") is not None:
            raise generator_error(owner(), f"torch.{name}", _user_line())
        return tracer.create_proxy("call_function", original, args, kwargs)

    return record


def _seed_refusals(owner: Callable[[], str]) -> list[tuple[Any, str, Callable[..., Any]]]:
    patches = []
    for name in ops.rng_state_functions():
        for namespace in _RNG_NAMESPACES:
            original = getattr(namespace, name, None)
            if original is not None:
                patches.append((namespace, name, _refusing(original, f"torch.{name}", owner)))
    return patches


def _refusing(original: Any, call: str, owner: Callable[[], str]) -> Callable[..., Any]:
    @functools.wraps(original)
    def refuse(*args: Any, **kwargs: Any) -> Any:
        if _called_from_torch():  # torch's own bookkeeping (fork_rng, export's tracing)
            return original(*args, **kwargs)
        raise seed_call_error(owner(), call, _user_line())

    return refuse


@contextlib.contextmanager
def _patched(patches: list[tuple[Any, str, Any]]) -> Iterator[None]:
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


class _RandomWork(TorchDispatchMode):
    """Fails the trace at a random aten op that runs for real: its values would be baked in.

    The shape-aware tracer's fake computations (``tracer.computing``) run ops on fake tensors,
    which bake nothing in."""

    def __init__(self, tracer: fx.Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        namespace, _, name = func._schema.name.partition("::")
        random = namespace == "aten" and ops.aten(name).random
        if random and not getattr(self.tracer, "computing", False):
            where = _user_line()
            at = f" at {where}" if where else ""
            raise RandomAtTraceTimeError(
                f"{func._schema.name} ran for real while torch.fx traced{at}, on a tensor made at "
                f"trace time rather than computed from the inputs: its random values would be "
                f"drawn once and baked into the graph, where eager draws new ones on every call. "
                f"Fix: draw with torch.rand, torch.randn, torch.randint or torch.normal "
                f"(fxmobile records those calls), or on a tensor made from an input "
                f"(x.new_zeros(...).normal_())"
            )
        return func(*args, **(kwargs or {}))


def _user_line() -> str | None:
    return innermost_user_frame(traceback.extract_stack())


_TORCH_DIR = os.path.dirname(torch.__file__)


def _called_from_torch() -> bool:
    """Whether the function calling the patched one (two frames up) is torch's own code."""
    return sys._getframe(2).f_code.co_filename.startswith(_TORCH_DIR)
