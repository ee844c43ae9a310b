"""The zoo on ExecuTorch (``--runtime executorch``): fxmobile's program beside ExecuTorch's own.

Per model, two programs of the same weights for ExecuTorch's XNNPACK delegate:

- ``fxmobile``: ``fxmobile.optimize(model, example_inputs=..., target_runtime="executorch")``,
  its gate on (a program that does not match eager is refused, and recorded as such);
- ``executorch``: ExecuTorch's own flow, as its XNNPACK tutorial gives it: ``torch.export``,
  ``to_edge_transform_and_lower`` with ``XnnpackPartitioner``, ``to_executorch``.

For each: whether it went through (and why not), whether it runs in ExecuTorch's runtime and
matches eager within the model's tolerance, its delegate calls and the op calls it leaves on
portable kernels (by op), its size and the seconds it took to make. With timed rounds, both
programs and eager are timed interleaved (``interleaved_medians``), the XNNPACK pool sized to
the run's threads. The point of the kind of run: every model ExecuTorch's own flow takes,
fxmobile takes, in fewer delegate calls and with fewer portable ops.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Collection
from typing import Any

import torch
from torch.utils import _pytree as pytree

import fxmobile
from fxmobile import MobileOptimizerType
from fxmobile.report import ProgramFacts
from fxmobile.timing import interleaved_medians
from fxmobile.verify import compare_outputs
from model_zoo_checks.results import (
    EXECUTORCH,
    FXMOBILE,
    ModelResult,
    ProgramRecord,
    Status,
    first_line,
)

# A flow: (model, inputs, tolerance, blocklist) -> (its program's runner, the program's facts)
Make = Callable[
    [torch.nn.Module, tuple[Any, ...], float | None, Collection[MobileOptimizerType]],
    tuple[Callable[..., Any], ProgramFacts],
]


def check_on_executorch(
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    tolerance: float | None,
    threads: int,
    rounds: Callable[[dict[str, Callable[[], object]]], int] | None,
    warmup: int = 1,
    blocklist: Collection[MobileOptimizerType] = (),
) -> tuple[dict[str, ProgramRecord], dict[str, float]]:
    """Both flows' programs of ``model``, checked on ``inputs`` against eager, and timed when
    ``rounds`` says how many rounds to time (given the candidates); ``blocklist`` goes to
    fxmobile's flow. Returns the records by flow and, when timed, eager's median and p10 ms
    (``{"median_ms": ..., "p10_ms": ...}``, else empty)."""
    from fxmobile.executorch.runtime import set_threads

    set_threads(threads)  # before any program is loaded: the pool is replaced
    with torch.no_grad():
        reference = model(*inputs)
    records: dict[str, ProgramRecord] = {}
    runners: dict[str, Callable[..., Any]] = {}
    flows: tuple[tuple[str, Make], ...] = ((EXECUTORCH, _own_flow), (FXMOBILE, _fxmobile_flow))
    for flow, make in flows:
        record = records[flow] = ProgramRecord(flow)
        start = time.perf_counter()
        try:
            runner, facts = make(model, inputs, tolerance, blocklist)
            record.seconds = time.perf_counter() - start
            _facts(record, facts)
            with torch.no_grad():
                actual = runner(*inputs)
            record.through = True
            record.relative_error = _worst(reference, actual, tolerance)
        except Exception as exc:
            record.seconds = time.perf_counter() - start
            record.error = first_line(exc)
            continue
        runners[flow] = runner
        record.passed = tolerance is None or record.relative_error <= tolerance  # NaN fails
        if not record.passed:
            record.error = f"relative error {record.relative_error:.3g} > {tolerance:g}"
    if rounds is None or not runners:
        return records, {}
    candidates: dict[str, Callable[[], object]] = {"eager": _call(model, inputs)}
    candidates.update({flow: _call(runner, inputs) for flow, runner in runners.items()})
    timings = interleaved_medians(candidates, rounds(candidates), warmup=warmup)
    for flow in runners:
        records[flow].median_ms = timings[flow].median_ms
        records[flow].p10_ms = timings[flow].p10_ms
    return records, {"median_ms": timings["eager"].median_ms, "p10_ms": timings["eager"].p10_ms}


def fill_result(
    result: ModelResult, records: dict[str, ProgramRecord], eager: dict[str, float]
) -> None:
    """``result`` as the zoo reports a model on ExecuTorch: both flows' records in
    ``programs``; its status, error, relative error and seconds to make are fxmobile's
    program's (passed: it matched eager; failed: it ran and differs; error: none was made)."""
    ours = records[FXMOBILE]
    result.programs = records
    result.status = (
        Status.PASSED if ours.passed else Status.FAILED if ours.through else Status.ERROR
    )
    result.error = ours.error
    result.relative_error = ours.relative_error
    result.optimize_seconds = ours.seconds
    result.eager_ms = eager.get("median_ms")
    result.eager_p10_ms = eager.get("p10_ms")


def _call(run: Callable[..., Any], inputs: tuple[Any, ...]) -> Callable[[], object]:
    """``run(*inputs)`` as a candidate of the timing, which takes no arguments."""
    return lambda: run(*inputs)


def _own_flow(
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    tolerance: float | None,
    blocklist: Collection[MobileOptimizerType],
) -> tuple[Callable[..., Any], ProgramFacts]:
    from fxmobile.executorch.export import export_module
    from fxmobile.executorch.lower import lower
    from fxmobile.executorch.runtime import ProgramRunner

    name = type(model).__name__
    exported = export_module(copy.deepcopy(model), inputs, name)
    lowered = lower(exported, name)
    return ProgramRunner(lowered.buffer, exported.call_spec.out_spec), lowered.facts


def _fxmobile_flow(
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    tolerance: float | None,
    blocklist: Collection[MobileOptimizerType],
) -> tuple[Callable[..., Any], ProgramFacts]:
    result = fxmobile.optimize(
        model,
        set(blocklist),
        example_inputs=inputs,
        tolerance=tolerance,
        target_runtime="executorch",
    )
    assert result.report.program is not None
    return result.run, result.report.program


def _facts(record: ProgramRecord, facts: ProgramFacts) -> None:
    record.delegate_calls = facts.delegate_calls
    record.portable_ops = facts.portable_count
    record.portable_by_op = {p.op: p.count for p in facts.portable_ops}
    record.nbytes = facts.nbytes


def _worst(reference: Any, actual: Any, tolerance: float | None) -> float:
    """The worst relative error over the tensor outputs (structures compared leaf by leaf)."""
    expected = [x for x in pytree.tree_leaves(reference) if isinstance(x, torch.Tensor)]
    got = [x for x in pytree.tree_leaves(actual) if isinstance(x, torch.Tensor)]
    checks = compare_outputs(expected, got, 1.0 if tolerance is None else tolerance)
    return max((c.relative_error for c in checks), default=0.0)
