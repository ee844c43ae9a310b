"""Latency, measured fairly on a shared machine: candidates interleaved, medians compared.

Timing one candidate after another lets a burst of load from another process land on one of
them only. Here every round runs each candidate once, in a fresh random order, so a slow spell
hits all of them alike; the median of the rounds then ignores the spells. Compare the ratios
of one call's medians, never absolute figures from different calls.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Timing:
    """One candidate's latency over the measured rounds, in milliseconds."""

    median_ms: float
    p10_ms: float  # a fast run: what the machine gives when nothing else is running
    p90_ms: float
    runs: int
    # every call's milliseconds, in the order they were measured (``report.plot()`` draws their
    # distribution); left out of ``to_dict`` and the repr, which stay a few numbers long
    samples_ms: tuple[float, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, float | int]:
        return {
            "median_ms": self.median_ms,
            "p10_ms": self.p10_ms,
            "p90_ms": self.p90_ms,
            "runs": self.runs,
        }


def interleaved_medians(
    candidates: Mapping[str, Callable[[], object]],
    rounds: int = 20,
    warmup: int = 2,
    seed: int = 0,
) -> dict[str, Timing]:
    """Run every candidate ``warmup`` times, then ``rounds`` shuffled rounds; per-name timings.

    Candidates run under ``torch.no_grad()``; a candidate that raises propagates.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = list(candidates)
    samples: dict[str, list[float]] = {name: [] for name in names}
    order = random.Random(seed)
    with torch.no_grad():
        for _ in range(warmup):
            for name in names:
                candidates[name]()
        for _ in range(rounds):
            order.shuffle(names)
            for name in names:
                start = time.perf_counter()
                candidates[name]()
                samples[name].append((time.perf_counter() - start) * 1000)
    return {name: summarize(values) for name, values in samples.items()}


def summarize(values: list[float]) -> Timing:
    """Median, 10th and 90th percentiles of per-call milliseconds, and the calls themselves."""
    ordered = sorted(values)
    return Timing(
        median_ms=statistics.median(ordered),
        p10_ms=ordered[len(ordered) // 10],
        p90_ms=ordered[min(len(ordered) - 1, (len(ordered) * 9) // 10)],
        runs=len(ordered),
        samples_ms=tuple(values),
    )
