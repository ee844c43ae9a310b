"""The live status line on a terminal: the phase running now and its seconds, then each phase done.

The entry points and the commands mark their phases with ``fxmobile.progress``; ``StatusLine``
listens (``progress.listening(line.event)``) and draws on stderr, only when stderr is a
terminal (``for_stream``): a piped or redirected stderr gets no progress at all, so logs hold
results and status lines only. While a phase runs, one line is redrawn in place a few times a
second (``\\r`` and erase-to-end-of-line): the innermost phase, its step count when it reports
one, and its seconds so far. When a phase ends the line gives way to a permanent one,
``capture 0.4 s``, indented by how deep the phase was nested. Other status text (``print``)
goes above the live line, which is drawn again under it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import TextIO

from fxmobile.progress import Event

_ERASE = "\r\x1b[K"  # carriage return, then erase to the end of the line
_REDRAW_SECONDS = 0.2


@dataclass
class _Running:
    name: str
    start: float
    done: int | None = None
    total: int | None = None


class StatusLine:
    """Draws the phases of a run on ``stream``, a terminal; ``close()`` ends the drawing."""

    def __init__(self, stream: TextIO, redraw_seconds: float | None = _REDRAW_SECONDS) -> None:
        self.stream = stream
        self._stack: list[_Running] = []
        self._lock = threading.Lock()
        self._shown = False  # a live line is on screen
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if redraw_seconds:
            self._ticker = threading.Thread(
                target=self._tick, args=(redraw_seconds,), name="fxmobile-status", daemon=True
            )
            self._ticker.start()

    @classmethod
    def for_stream(cls, stream: TextIO) -> StatusLine | None:
        """A status line on ``stream`` when it is a terminal; None otherwise."""
        isatty = getattr(stream, "isatty", None)
        try:
            return cls(stream) if isatty is not None and isatty() else None
        except ValueError:  # a closed stream
            return None

    def event(self, event: Event) -> None:
        """A ``fxmobile.progress`` listener: start, advance or end a phase."""
        with self._lock:
            if event.ended:
                self._end(event)
            elif event.done is not None:
                self._advance(event)
            else:
                self._stack.append(_Running(event.name, time.perf_counter()))
            self._draw()

    def print(self, text: str) -> None:
        """``text`` on its own line above the live one."""
        with self._lock:
            self._clear()
            self.stream.write(text + "\n")
            self._draw()

    def close(self) -> None:
        """Stop redrawing and take the live line off the screen."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            self._clear()
            self._stack.clear()
            self.stream.flush()

    # --- inside the lock ---------------------------------------------------------------------

    def _end(self, event: Event) -> None:
        depth = next(
            (i for i in range(len(self._stack) - 1, -1, -1) if self._stack[i].name == event.name),
            None,
        )
        if depth is None:  # ended without a start this line saw
            return
        del self._stack[depth:]
        self._clear()
        self.stream.write(f"{'  ' * depth}{event.name} {event.seconds:.1f} s\n")

    def _advance(self, event: Event) -> None:
        if not self._stack:  # a step outside any phase stands for one
            self._stack.append(_Running(event.name, time.perf_counter()))
        running = self._stack[-1]
        running.done, running.total = event.done, event.total

    def _draw(self) -> None:
        if not self._stack:
            self._clear()
            self.stream.flush()
            return
        running = self._stack[-1]
        count = f" {running.done}/{running.total}" if running.total else ""
        text = f"{running.name}{count} {time.perf_counter() - running.start:.1f} s…"
        self.stream.write(_ERASE + text[: self._width() - 1])
        self.stream.flush()
        self._shown = True

    def _clear(self) -> None:
        if self._shown:
            self.stream.write(_ERASE)
            self._shown = False

    def _width(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            return 80

    def _tick(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            with self._lock:
                if self._stack:
                    self._draw()
