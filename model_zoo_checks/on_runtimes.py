"""The zoo on the real mobile runtimes (``--runtime 1.13.1|2.12.1|all``).

Per model, the CPU file fxmobile saved goes to each selected reference runtime
(``fxmobile.runtime``): does its lite interpreter load it, and do its outputs there match eager's
within the model's tolerance. On 2.12.1, the runtime built with XNNPACK, three candidates are
then timed interleaved (``compare_latency``): eager here, fxmobile's file there, and upstream's
``optimize_for_mobile`` file made there from the same weights. A model that does not script has
no upstream candidate and says so in its notes.

The runtimes' processes are started once per zoo process and kept for every model; one that
dies is started again for the next model.
"""

from __future__ import annotations

import atexit
from collections.abc import Sequence
from typing import Any

import torch

from fxmobile.runtime import RuntimeCheck, RuntimeProcess, against_upstream, check_on_runtimes
from model_zoo_checks.results import LATENCY_RUNTIME, ModelResult, RuntimeRecord

_RUNNING: dict[tuple[str, int], RuntimeProcess] = {}


def runtime_versions(choice: str | None) -> tuple[str, ...]:
    """``--runtime``'s value as runtime versions, oldest first: none, one, or all."""
    from fxmobile.runtime.check import runtime_versions as versions

    return () if choice is None else tuple(versions(choice))


def process(version: str, threads: int) -> RuntimeProcess:
    """The running process of ``version`` (started on first use, and again if it died)."""
    key = (version, threads)
    running = _RUNNING.get(key)
    if running is None or running._closed:
        running = _RUNNING[key] = RuntimeProcess(version, threads=threads)
    return running


@atexit.register
def _stop_all() -> None:
    for running in _RUNNING.values():
        running.close()
    _RUNNING.clear()


def check_file_on_runtimes(
    result: ModelResult,
    model: torch.nn.Module,
    data: bytes,
    inputs: Sequence[Any],
    versions: Sequence[str],
    threads: int,
    min_time: float,
    rounds: int,
) -> None:
    """Fill ``result.runtimes`` (and, with 2.12.1 among ``versions`` and ``rounds`` > 0,
    ``result.runtime_ms``) for the saved file ``data``. A refusal or a mismatch is recorded; a
    failure on upstream's side or in the timing becomes a note and the file is still checked;
    a runtime that dies raises ``RuntimeCrashedError`` (the runner records it)."""
    tolerance = result.tolerance if result.tolerance is not None else 1e-4
    with torch.no_grad():
        reference = model(*inputs)
    others = [v for v in versions if v != LATENCY_RUNTIME]
    running = {v: process(v, threads) for v in versions}
    for check in check_on_runtimes(data, inputs, others, reference, tolerance, processes=running):
        result.runtimes[check.runtime] = _record(check)
    if LATENCY_RUNTIME not in versions:
        return
    try:
        found = against_upstream(
            model,
            data,
            inputs,
            [LATENCY_RUNTIME],
            latency=rounds > 0,
            rounds=max(rounds, 1),
            calls=1,
            threads=threads,
            tolerance=tolerance,
            processes=running,
            min_time=min_time,
        )
    except Exception as exc:  # upstream's side or the timing failed: the file is still checked
        result.notes.append(f"upstream candidate or latency on {LATENCY_RUNTIME}: {exc}")
        running[LATENCY_RUNTIME] = process(LATENCY_RUNTIME, threads)  # again, if it died
        (check,) = check_on_runtimes(
            data, inputs, [LATENCY_RUNTIME], reference, tolerance, processes=running
        )
        result.runtimes[LATENCY_RUNTIME] = _record(check)
        return
    (check,) = found.checks
    record = _record(check)
    upstream = found.upstream_checks.get(LATENCY_RUNTIME)
    if upstream:
        record.upstream_relative_error = max(c.relative_error for c in upstream)
    result.runtimes[LATENCY_RUNTIME] = record
    result.notes += found.notes
    if found.latency is None:
        return
    names = {
        "eager": "eager",
        "fxmobile": f"fxmobile file on {LATENCY_RUNTIME}",
        "upstream": f"upstream file on {LATENCY_RUNTIME}",
    }
    for key, name in names.items():
        if name in found.latency:
            result.runtime_ms[key] = found.latency[name].timing.median_ms
            result.runtime_p10_ms[key] = found.latency[name].timing.p10_ms


def _record(check: RuntimeCheck) -> RuntimeRecord:
    return RuntimeRecord(
        runtime=check.runtime,
        kernels=check.kernels,
        loads=check.loads,
        passed=check.passed,
        relative_error=check.relative_error,
        error=check.error,
    )


def saved_file(mobile: Any) -> bytes:
    """What ``MobileResult.save`` writes: the file an app ships."""
    from fxmobile.api import lite_file

    return lite_file(mobile.module, mobile.target_runtime)
