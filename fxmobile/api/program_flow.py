"""``optimize(..., target_runtime="executorch")``: an ExecuTorch program for the XNNPACK delegate.

The model is captured and goes through the FX passes as for a lite-interpreter file (without
the channels-last rewrite: the delegate picks its own layout), then is exported, rewritten at
the ATen level for whole delegation (``fxmobile.executorch.passes``), exported again and
lowered. Where torch.fx cannot capture the model, ``torch.export`` takes the eager model
itself, and the report says so. Each step is a row of the report with its time.
"""

from __future__ import annotations

import time
from typing import Any

from torch import nn
from torch.export import ExportedProgram

from fxmobile.api.fx_flow import Clock, Observe, fx_stage
from fxmobile.capture.checks import deep_copy, eager_arguments
from fxmobile.capture.layouts import layout_dependence
from fxmobile.capture.random_calls import refusing_rng_state_calls
from fxmobile.errors import CaptureError, ExportError, RefusedError
from fxmobile.executorch import require
from fxmobile.executorch.export import THE_OTHER_ROUTE, aten_nodes, export_module, rewritable
from fxmobile.executorch.layout import contiguous_attributes, contiguous_inputs
from fxmobile.executorch.lower import Lowered, lower
from fxmobile.executorch.passes.pipeline import export_pipeline
from fxmobile.executorch.passes.stage import ExportStage
from fxmobile.executorch.runtime import ProgramRunner
from fxmobile.infra import PassManager
from fxmobile.options import Options
from fxmobile.passes.stage import FxContext, count_nodes
from fxmobile.progress import phase
from fxmobile.report import PassRecord, Report, Stage, Status
from fxmobile.verify import reference_outputs

BACKEND = "ExecuTorch (XNNPACK delegate)"
EXPORT_ROUTE = "torch.export"


def to_program(
    module: nn.Module, options: Options, clock: Clock, observe: Observe | None = None
) -> tuple[Lowered, ProgramRunner, Report, Any]:
    """The lowered program, a runner of it, the report, and eager's outputs (None in a re-run,
    ``observe`` set)."""
    require("target_runtime='executorch'")
    inputs = options.example_inputs
    assert inputs is not None  # the entry point requires them for this target
    name = type(module).__name__
    try:
        gm, report, expected = fx_stage(module, options, clock, observe=observe)
        graph: nn.Module = gm
        nodes = count_nodes(gm)
    except RefusedError:
        raise
    except CaptureError as declined:
        graph, report, expected = _eager(module, options, clock, declined, observe)
        nodes = 0
    report.backend = BACKEND
    with phase("torch.export"), refusing_rng_state_calls(name):
        exported = _timed_export(graph, inputs, name, report, nodes, "torch.export")
    exported = _export_passes(exported, options, report, observe)
    with phase("lowering to XNNPACK"):
        lowered = lower(exported, name)
    before = aten_nodes(exported.graph)
    report.passes.append(
        _step("to_edge_transform_and_lower", before, lowered.edge_nodes, lowered.edge_seconds)
    )
    report.passes.append(
        _step("to_executorch", lowered.edge_nodes, lowered.edge_nodes, lowered.program_seconds)
    )
    report.program = lowered.facts
    runner = ProgramRunner(lowered.buffer, exported.call_spec.out_spec)
    if observe is not None:
        observe("lower")("to_executorch", runner)
    return lowered, runner, report, expected


def _eager(
    module: nn.Module,
    options: Options,
    clock: Clock,
    declined: CaptureError,
    observe: Observe | None,
) -> tuple[nn.Module, Report, Any]:
    """The eager model itself for torch.export, where torch.fx could not capture it."""
    copied = deep_copy(module).eval()
    name = type(module).__name__
    # torch.export keeps the branch the example inputs took, and a branch on their memory
    # layout (`if x.is_contiguous():`) says nothing while it is taken: a program of one branch
    # is refused for a model whose outputs change with the layout, whatever `check` says
    variant = layout_dependence(copied, options.example_inputs or (), options.tolerance)
    if variant is not None:
        raise ExportError(
            f"{name} returns other outputs for {variant} than for the example inputs: its "
            f"forward depends on its inputs' memory layout (a branch on x.is_contiguous() or "
            f"x.stride()), and an ExecuTorch program holds only the branch the example took. "
            f"{THE_OTHER_ROUTE}"
        )
    report = Report(model_name=name, route=EXPORT_ROUTE)
    report.declined = [f"torch.fx: {declined}"]
    report.notes.append(
        "the FX passes did not run: torch.fx could not capture the model, so torch.export "
        "took the eager model"
    )
    expected = None
    if options.checks and observe is None:
        args, kwargs = eager_arguments(copied, options.example_inputs or (), {})
        reference = deep_copy(module).eval()
        expected, _ = clock.check(
            lambda: reference_outputs(reference, report.model_name, args, kwargs)
        )
    return copied, report, expected


def _export_passes(
    exported: ExportedProgram, options: Options, report: Report, observe: Observe | None
) -> ExportedProgram:
    """fxmobile's passes on the exported graph, and the graph exported again when they
    rewrote it."""
    passes = export_pipeline()
    if not passes:
        return exported
    inputs = options.example_inputs
    observer = observe("export") if observe else None
    manager = PassManager(
        passes, ExportStage(inputs), FxContext(inputs), options.blocklist, observer=observer
    )
    with phase("ExecuTorch passes"):
        graph = rewritable(exported)
        graph, records = manager.run(graph)
    report.passes.extend(records)
    if not any(r.rewrites for r in records):
        return exported
    assert inputs is not None
    with phase("torch.export"):
        return _timed_export(
            graph,
            inputs,
            report.model_name,
            report,
            aten_nodes(graph.graph),
            "torch.export (again)",
        )


def _timed_export(
    graph: nn.Module,
    inputs: tuple[Any, ...],
    name: str,
    report: Report,
    nodes_before: int,
    step: str,
) -> ExportedProgram:
    start = time.perf_counter()
    # in the one layout a program has: graph is fxmobile's copy, its tensors replaced
    contiguous_attributes(graph)
    exported = export_module(graph, contiguous_inputs(inputs), name)
    seconds = time.perf_counter() - start
    report.passes.append(_step(step, nodes_before, aten_nodes(exported.graph), seconds))
    return exported


def _step(name: str, before: int, after: int, seconds: float) -> PassRecord:
    """A report row for a step that is not a pass (export, lowering): its nodes and time."""
    stage = Stage.EXPORT if name.startswith("torch.export") else Stage.LOWER
    return PassRecord(
        name=name,
        stage=stage,
        status=Status.RAN,
        nodes_before=before,
        nodes_after=after,
        seconds=seconds,
        step=True,
    )


def rerun(module: nn.Module, options: Options, observe: Observe) -> None:
    """The whole pipeline once more, every step observed (the report is thrown away)."""
    to_program(module, options, Clock(), observe)
