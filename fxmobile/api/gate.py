"""The gate every route ends in: the result run against eager, and what a mismatch does.

The result runs on each input set of eager's reference (``fxmobile.capture.reference``): the
example inputs, fresh values of their shapes, and their values in another memory layout, each
once more (twice on the routes that take the model whole, state and all), seeded as eager was,
and from the caller's state each time: the gate's runs leave the module it hands back as it
found it. An ExecuTorch program keeps its mutable buffers in its loaded method, so each set
runs on a fresh load of the program.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fxmobile.api.fx_flow import Clock, Observe
from fxmobile.capture.reference import EXAMPLE, InputSet, Reference, run_kept
from fxmobile.executorch.runtime import ProgramRunner
from fxmobile.infra import Observer
from fxmobile.options import Options
from fxmobile.progress import phase
from fxmobile.report import Report
from fxmobile.report.records import OutputCheck
from fxmobile.verify import (
    compare_outputs,
    divergence_observer,
    enforce,
    first_divergence,
    run_calls,
)

# The routes that take the model whole, state and all: their check runs the result twice.
FALLBACK_ROUTES = frozenset({"torch.jit.trace", "torch.jit.script"})


def check(
    report: Report,
    options: Options,
    clock: Clock,
    expected: Any,
    result: Callable[..., Any],
    rerun: Callable[[Observe], object],
) -> None:
    """Compare ``result`` with eager's ``expected`` (a ``Reference``, or eager's outputs on the
    example inputs alone) on each input set, then apply the gate.

    ``rerun(observe)`` runs the pipeline again, reporting each pass's result to the stage's
    observer, to find where the outputs diverge on the first input set that failed; it is
    called only on a mismatch.
    """
    calls = 2 if report.route in FALLBACK_ROUTES else 1
    reference = _reference(expected, options)

    def run(unit: Callable[..., Any], inputs: tuple[Any, ...], times: int) -> Any:
        return run_kept(_throwaway(unit), inputs, reference.caller, times, run_calls)

    numerics: list[OutputCheck] = []
    failed: tuple[InputSet, Any] | None = None
    with phase("checking against eager"):
        for input_set, want in zip(reference.sets, reference.outputs, strict=True):
            compare = functools.partial(
                _compare, input_set, want, result, run, calls, options.tolerance
            )
            checks = clock.check(compare)
            numerics += checks
            if failed is None and not all(c.passed for c in checks):
                failed = (input_set, want)
    report.numerics = numerics  # a row per output and input set: "output (fresh values)"
    report.notes.extend(reference.notes)
    where_set, where_expected = failed or (reference.sets[0], reference.example)

    def observe(stage: str) -> Observer:
        return divergence_observer(
            where_expected, where_set.inputs, options.tolerance, stage, calls, run
        )

    enforce(report, options.check, lambda: first_divergence(lambda: rerun(observe)))


def _reference(expected: Any, options: Options) -> Reference:
    """``expected`` as a ``Reference``: a route that computed eager's outputs on the example
    inputs alone is checked on them alone (the report names the one set)."""
    if isinstance(expected, Reference):
        return expected
    example = InputSet(EXAMPLE, options.example_inputs or ())
    return Reference((example,), (expected,))


def _compare(
    input_set: InputSet,
    expected: Any,
    result: Callable[..., Any],
    run: Callable[[Callable[..., Any], tuple[Any, ...], int], Any],
    calls: int,
    tolerance: float | None,
) -> list[OutputCheck]:
    """The result against eager on one input set; each row's path names the set, but for the
    example inputs. A result that fails where eager runs fails every output of the set (on
    the example inputs, its error propagates, as it always has)."""
    if input_set.name == EXAMPLE:
        return compare_outputs(expected, run(result, input_set.inputs, calls), tolerance)
    try:
        checks = compare_outputs(expected, run(result, input_set.inputs, calls), tolerance)
    except Exception as exc:
        line = (str(exc).strip().splitlines() or [""])[0]
        failed = f"fails on {input_set.name}: {type(exc).__name__}: {line}"
        return [
            replace(c, path=f"{c.path} ({failed})", max_abs_error=float("inf"))
            for c in compare_outputs(expected, expected, tolerance)
        ]
    return [replace(c, path=f"{c.path} ({input_set.name})") for c in checks]


def _throwaway(unit: Callable[..., Any]) -> Callable[..., Any]:
    """What the gate runs for ``unit``: the unit itself (its state is set back after each
    run), or, for an ExecuTorch program, a fresh load of it: a loaded program keeps one
    method, whose mutable buffers keep what every call wrote (so the runner handed back
    would start where the gate's last run left it). ExecuTorch's ``Program`` holds the bytes
    it was loaded from as ``_data``."""
    data = getattr(getattr(unit, "program", None), "_data", None)
    if isinstance(unit, ProgramRunner) and isinstance(data, bytes):
        return ProgramRunner(data, unit.out_spec, unit.method_name)
    return unit
