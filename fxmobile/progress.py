"""The phases of a run that can take seconds, told to whoever listens.

The entry points mark their phases (capture, the passes, scripting, checks, export, lowering,
latency rounds) with ``phase`` and count steps inside one with ``step``; nothing is printed
here. A front end that wants to show progress (the command line, on a terminal) registers a
listener with ``listening`` for the duration of a call. Without a listener a phase costs a
context variable lookup.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    """A phase started (``seconds`` None), advanced (``done`` of ``total``) or ended."""

    name: str
    seconds: float | None = None
    done: int | None = None
    total: int | None = None

    @property
    def ended(self) -> bool:
        """Whether this event closes its phase."""
        return self.seconds is not None


Listener = Callable[[Event], None]

_LISTENERS: contextvars.ContextVar[tuple[Listener, ...]] = contextvars.ContextVar(
    "fxmobile_progress_listeners", default=()
)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Send every event of the calls made inside the block to ``listener``."""
    token = _LISTENERS.set((*_LISTENERS.get(), listener))
    try:
        yield
    finally:
        _LISTENERS.reset(token)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the block as the phase ``name`` ("capture", "lowering to XNNPACK", ...)."""
    listeners = _LISTENERS.get()
    if not listeners:
        yield
        return
    _emit(listeners, Event(name))
    start = time.perf_counter()
    try:
        yield
    finally:
        _emit(listeners, Event(name, seconds=time.perf_counter() - start))


def step(name: str, done: int, total: int) -> None:
    """Say that ``done`` of ``total`` steps of the phase ``name`` are done."""
    listeners = _LISTENERS.get()
    if listeners:
        _emit(listeners, Event(name, done=done, total=total))


def _emit(listeners: tuple[Listener, ...], event: Event) -> None:
    for listener in listeners:
        listener(event)
