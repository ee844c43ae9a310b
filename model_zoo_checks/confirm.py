"""A latency regression is reported only once the model, timed again alone, still shows it.

In a whole-zoo run every model is timed while the machine does whatever else it does: a
classification run with another job on this 2-core machine flagged 39 of 78 models slower (every
one correct numerically), and a quiet re-run of five of them flagged two. So each model with a
flagged ``latency_ratio`` or ``runtime_ratio`` is checked once more, by itself, with at least
``RETIME_MIN_TIME`` seconds of timed rounds; its first figures go to ``retimed_from`` and the
re-timed result replaces it. What still regresses is reported; the rest is listed as not
confirmed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from fxmobile import Backend
from model_zoo_checks.baseline import LATENCY_METRICS, Baseline, Regression, Thresholds, compare
from model_zoo_checks.results import ModelResult
from model_zoo_checks.runner import RunOptions
from model_zoo_checks.zoo import ZooModel

RETIME_MIN_TIME = 3.0  # seconds of timed rounds per candidate set when a model is re-timed

Check = Callable[[ZooModel, RunOptions], list[ModelResult]]


@dataclasses.dataclass
class Confirmed:
    """What ``confirm_latency`` returns: the results to report, and the regressions that held."""

    results: list[ModelResult]  # the run's results, flagged models' CPU results re-timed
    regressions: list[Regression]
    not_confirmed: list[str]  # one line per flagged latency regression the re-timing cleared


def confirm_latency(
    results: Sequence[ModelResult],
    baseline: Baseline,
    thresholds: Thresholds,
    entries: Sequence[ZooModel],
    options: RunOptions,
    check: Check,
) -> Confirmed:
    """``compare``, with each model flagged on a latency metric re-timed alone first."""
    first = compare(results, baseline, thresholds)
    flagged = {r.key: r for r in first if r.metric in LATENCY_METRICS}
    if not flagged:
        return Confirmed(list(results), first, [])
    by_key = {entry.key: entry for entry in entries}
    again = dataclasses.replace(
        options,
        backends=(Backend.CPU,),
        min_time=max(options.min_time, RETIME_MIN_TIME),
    )
    retimed: dict[str, ModelResult] = {}
    for key in flagged:
        (fresh,) = check(by_key[key], again)
        old = next(r for r in results if r.key == key and r.backend == Backend.CPU.value)
        fresh.retimed_from = {
            "latency_ratio": old.latency_ratio,
            "runtime_ratio": old.runtime_ratio,
        }
        retimed[fresh.id] = fresh
    updated = [retimed.get(r.id, r) for r in results]
    regressions = compare(updated, baseline, thresholds)
    still = {(r.key, r.metric) for r in regressions}
    not_confirmed = [
        f"{r} flagged, then re-timed alone: "
        f"{_ratio(retimed[f'{r.key}/{r.backend}'], r)}, not a regression"
        for r in first
        if r.metric in LATENCY_METRICS and (r.key, r.metric) not in still
    ]
    return Confirmed(updated, regressions, not_confirmed)


def _ratio(result: ModelResult, regression: Regression) -> str:
    value = getattr(result, regression.metric.value)
    return "not measured" if value is None else f"{value:.3g}"
