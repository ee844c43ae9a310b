"""Latency of candidates that live in different processes, measured side by side.

A candidate times ``n`` calls wherever it runs and returns one figure per call: ``Here`` runs a
callable in this process, ``OnRuntime`` a file loaded in a reference runtime's process (the
child times its own calls, so the pipe is not in the figures). ``compare_latency`` runs every
candidate in a fresh random order each round, so a burst of load from elsewhere lands on all
of them alike, and summarizes the per-call times as ``fxmobile.timing`` does (median,
10th and 90th percentile). Compare the ratios of one run, never figures from different runs.

Every result carries where it ran and on which kernels: a latency table names both per row.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from tabulate import tabulate

from fxmobile.errors import InvalidValueError
from fxmobile.progress import phase, step
from fxmobile.runtime.process import LoadedFile
from fxmobile.timing import Timing, summarize


class Candidate(Protocol):
    """Something to time, and where it runs: the names every latency row carries."""

    runs_on: str  # "torch 2.15.0, this process" / "torch 2.12.1 (reference runtime)"
    kernels: str  # "fxmobile._C", "XNNPACK", "ATen (eager)"

    def time(self, n: int) -> list[float]:
        """Milliseconds of each of ``n`` calls."""
        ...


class Here:
    """``function(*inputs)`` in this process, under ``torch.no_grad()``."""

    def __init__(self, function: Callable[..., Any], inputs: Sequence[Any], kernels: str) -> None:
        self.function = function
        self.inputs = tuple(inputs)
        self.kernels = kernels
        self.runs_on = f"torch {torch.__version__.split('+')[0]}, this process"

    def time(self, n: int) -> list[float]:
        times = []
        with torch.no_grad():
            for _ in range(n):
                start = time.perf_counter()
                self.function(*self.inputs)
                times.append((time.perf_counter() - start) * 1000)
        return times


class OnRuntime:
    """A file loaded in a reference runtime (``RuntimeProcess.load``), timed there."""

    def __init__(self, loaded: LoadedFile, inputs: Sequence[Any], method: str = "forward") -> None:
        self.loaded = loaded
        self.inputs = tuple(inputs)
        self.method = method
        info = loaded.runtime.info
        self.kernels = info.kernels
        self.runs_on = info.label

    def time(self, n: int) -> list[float]:
        return self.loaded.time(n, *self.inputs, method=self.method)


@dataclass(frozen=True)
class Latency:
    """One candidate's per-call times, summarized, and where they were taken."""

    timing: Timing
    runs_on: str
    kernels: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.timing.to_dict(), "runs_on": self.runs_on, "kernels": self.kernels}


def compare_latency(
    candidates: Mapping[str, Candidate],
    rounds: int = 20,
    calls: int = 1,
    warmup: int = 2,
    seed: int = 0,
    min_time: float = 0.0,
    max_rounds: int = 100,
) -> dict[str, Latency]:
    """``warmup`` untimed calls per candidate, then ``rounds`` rounds: each candidate, in a
    fresh shuffled order per round, times ``calls`` calls back to back. Per candidate: the
    median, 10th and 90th percentile of its ``rounds * calls`` per-call times.

    ``min_time`` (seconds) gives fast candidates more rounds: as many as the last warm-up
    calls say fill that time, at most ``max_rounds`` and never fewer than ``rounds``, so a
    median of a few milliseconds is not one burst of noise."""
    if rounds < 1 or calls < 1 or warmup < 0 or max_rounds < rounds or min_time < 0:
        raise InvalidValueError(
            f"rounds and calls must be at least 1, warmup and min_time at least 0, and "
            f"max_rounds at least rounds; got rounds={rounds}, calls={calls}, warmup={warmup}, "
            f"min_time={min_time}, max_rounds={max_rounds}"
        )
    if not candidates:
        raise InvalidValueError("compare_latency needs at least one candidate")
    names = list(candidates)
    # Each candidate's last warm-up call estimates a round (min_time needs at least one).
    warm = max(warmup, 1) if min_time else warmup
    one_round_ms = 0.0
    if warm:
        with phase("latency warm-up"):
            for name in names:
                one_round_ms += candidates[name].time(warm)[-1] * calls
    if min_time and one_round_ms > 0:
        rounds = max(rounds, min(int(min_time * 1000 / one_round_ms), max_rounds))
    samples: dict[str, list[float]] = {name: [] for name in names}
    order = random.Random(seed)
    with phase("latency rounds"):
        for done in range(rounds):
            step("latency rounds", done, rounds)
            order.shuffle(names)
            for name in names:
                samples[name].extend(candidates[name].time(calls))
    return {
        name: Latency(summarize(samples[name]), candidates[name].runs_on, candidates[name].kernels)
        for name in candidates
    }


def latency_table(
    results: Mapping[str, Latency], baseline: str | None = None, tablefmt: str = "simple"
) -> str:
    """One row per candidate: where it ran, its kernels, median, p10 and p90 ms, and its
    speed-up against ``baseline`` (default: the first candidate; no column for one candidate),
    in tabulate's ``tablefmt``."""
    names = list(results)
    if not names:
        return ""
    reference = baseline or names[0]
    base = results[reference].timing.median_ms
    rows = [
        [
            name,
            result.runs_on,
            result.kernels,
            f"{result.timing.median_ms:.2f}",
            f"{result.timing.p10_ms:.2f}",
            f"{result.timing.p90_ms:.2f}",
            f"{base / result.timing.median_ms:.2f}x",
        ]
        for name, result in results.items()
    ]
    headers = ["candidate", "runs on", "kernels", "median ms", "p10 ms", "p90 ms"]
    headers.append(f"speed-up vs {reference}")
    if len(rows) == 1:  # a speed-up of itself
        rows, headers = [row[:-1] for row in rows], headers[:-1]
    return tabulate(
        rows,
        headers=headers,
        tablefmt=tablefmt,
        disable_numparse=True,
        colalign=["left", "left", "left", "right", "right", "right", "right"][: len(headers)],
    )
