"""The gate every route ends in: the result run against eager, and what a mismatch does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fxmobile.api.fx_flow import Clock, Observe
from fxmobile.infra import Observer
from fxmobile.options import Options
from fxmobile.progress import phase
from fxmobile.report import Report
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
    """Compare ``result`` with ``expected`` on the example inputs, then apply the gate.

    ``rerun(observe)`` runs the pipeline again, reporting each pass's result to the stage's
    observer, to find where the outputs diverge; it is called only on a mismatch.
    """
    inputs = options.example_inputs or ()
    calls = 2 if report.route in FALLBACK_ROUTES else 1
    with phase("checking against eager"):
        actual = clock.check(lambda: run_calls(result, inputs, calls))
    report.numerics = compare_outputs(expected, actual, options.tolerance)

    def observe(stage: str) -> Observer:
        return divergence_observer(expected, inputs, options.tolerance, stage, calls)

    enforce(report, options.check, lambda: first_divergence(lambda: rerun(observe)))
