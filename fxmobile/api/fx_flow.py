"""The FX half of every route: capture, then the FX passes, timed apart from the checks."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from fxmobile.capture import capture
from fxmobile.capture.state import state_kept
from fxmobile.infra import Observer, PassManager
from fxmobile.options import Options
from fxmobile.passes.pipeline import fx_pipeline
from fxmobile.passes.stage import FxContext, FxStage
from fxmobile.progress import phase
from fxmobile.report import Report

# Given a stage's name ("fx", "script"), the observer a re-run of that stage reports to.
Observe = Callable[[str], Observer]


class Clock:
    """Optimization time and check time, apart (the report shows both)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.checking = 0.0

    def check(self, run: Callable[[], Any]) -> Any:
        """Run ``run``, counting its time as checking."""
        start = time.perf_counter()
        try:
            return run()
        finally:
            self.checking += time.perf_counter() - start

    def record(self, report: Report) -> None:
        """Write the time since the clock started into ``report``, checks apart."""
        total = time.perf_counter() - self.start
        report.optimize_seconds = total - self.checking
        report.check_seconds = self.checking


def fx_stage(
    model: nn.Module,
    options: Options,
    clock: Clock,
    *,
    for_script: bool = False,
    observe: Observe | None = None,
) -> tuple[fx.GraphModule, Report, Any]:
    """Capture and the FX passes; the graph module, its report and eager's outputs on each input
    set the gate checks (a ``Reference``; None without a check, or in a re-run: ``observe``
    set)."""
    with phase("capture"), rng_kept():
        captured = capture(model, options)
    inputs = options.example_inputs
    expected = captured.reference if observe is None else None
    clock.checking += captured.reference_seconds
    report = Report(model_name=type(model).__name__, notes=list(captured.notes))
    report.route, report.declined = captured.route, list(captured.declined)
    report.hooks = list(captured.hooks)
    report.parametrizations = dict(captured.parametrizations)
    passes = fx_pipeline(channels_last=options.channels_last, for_script=for_script)
    observer = observe("fx") if observe else None
    manager = PassManager(
        passes, FxStage(inputs), FxContext(inputs), options.blocklist, observer=observer
    )
    # shape propagation and the passes' own checks run the graph: leaves that keep state
    # (a counter) end as the caller's model has it
    with phase("FX passes"), state_kept(captured.graph_module, model), rng_kept():
        gm, records = manager.run(captured.graph_module)
    report.passes.extend(records)
    return gm, report, expected


def rng_kept() -> contextlib.AbstractContextManager[object]:
    """Torch's random generator as it was after what runs inside: fxmobile's own runs of a
    model that draws random numbers (shape propagation, a trace, probes) do not advance the
    caller's draws."""
    return torch.random.fork_rng(devices=[])
