"""The public entry points: ``optimize_fx``, ``optimize`` and the drop-in ``optimize_for_mobile``.

Each validates its arguments once, into ``fxmobile.options.Options`` (and the model, with
``fxmobile.capture.admit``), then runs the stages, which trust what they are given:

- an eager ``nn.Module`` is captured with torch.fx and goes through the FX passes
  (``optimize_fx`` stops there), then is scripted;
- a ``ScriptModule`` (or an eager model with preserved methods, which torch.fx cannot trace)
  enters at the TorchScript stage: a clone in eval mode is frozen, rewritten for the backend and
  marked.

The caller's module is never modified. With example inputs, the result is checked against the
unoptimized model (``fxmobile.verify``): by default a mismatch raises ``NumericalMismatchError``
naming the first pass after which the outputs diverge.
"""

from __future__ import annotations

import copy
import io
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.jit.mobile
from torch import fx, nn

from fxmobile.backends.library import ensure_registered
from fxmobile.backends.registry import backend_spec
from fxmobile.capture import admit, capture
from fxmobile.capture.checks import check_tensors, deep_copy, eager_arguments, has_forward
from fxmobile.capture.hooks import fallback_hook_records
from fxmobile.errors import CaptureError, RefusedError, ScriptingError
from fxmobile.infra import Observer, PassManager
from fxmobile.options import (
    DEFAULT_TOLERANCE,
    Backend,
    BlocklistItem,
    Check,
    LeafSpec,
    MobileOptimizerType,
    Options,
    make_options,
)
from fxmobile.passes.pipeline import fx_pipeline
from fxmobile.passes.stage import FxContext, FxStage
from fxmobile.report import FileFacts, Report
from fxmobile.runtime.compat import backport_for, file_compatibility
from fxmobile.runtime.process import runtime_spec
from fxmobile.script.freeze import bundled_inputs_attributes
from fxmobile.script.graph_utils import existing_methods, op_histogram, unfused_ops
from fxmobile.script.lints import generate_mobile_module_lints
from fxmobile.script.scripting import (
    clone_script_module,
    fallback_to_torchscript,
    quietly_script,
    to_torchscript,
)
from fxmobile.script.serialization import lite_interpreter_bytes
from fxmobile.script.stage import ScriptContext, ScriptStage
from fxmobile.verify import (
    compare_outputs,
    divergence_observer,
    enforce,
    first_divergence,
    reference_outputs,
    run_calls,
)


@dataclass
class FxResult:
    """The optimized ``GraphModule`` and the report of how it was made."""

    graph_module: fx.GraphModule
    report: Report


@dataclass
class MobileResult:
    """The optimized ``ScriptModule`` and the report of both stages."""

    module: torch.jit.ScriptModule
    report: Report

    target_runtime: str | None = None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a lite-interpreter file (load it with ``_load_for_lite_interpreter``), in the
        bytecode ``target_runtime`` reads; the report's ``file`` then describes that file.

        The bytes are loaded back in the lite interpreter first: a file it cannot read (an output
        type its type parser does not know, such as a ``Union``) is a ``ScriptingError``, and
        nothing is written."""
        data = lite_file(self.module, self.target_runtime)
        try:
            torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(data))
        except RuntimeError as exc:
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            raise ScriptingError(
                f"the lite interpreter cannot load {self.report.model_name}'s file: "
                f"{lines[0] if lines else type(exc).__name__}. Fix: return tensors, or a tuple, "
                "list or dict whose values are all of one type, from forward."
            ) from exc
        with open(path, "wb") as out:
            out.write(data)
        self.report.file = file_facts(data)


def optimize_fx(
    model: nn.Module,
    example_inputs: Any = None,
    *,
    blocklist: Iterable[BlocklistItem] | None = None,
    leaf_modules: Iterable[LeafSpec] = (),
    concrete_args: Mapping[str, Any] | None = None,
    auto_leaf: bool = True,
    eval_copy: bool = False,
    channels_last: bool = False,
    tolerance: float = DEFAULT_TOLERANCE,
    check: Check | str = Check.RAISE,
) -> FxResult:
    """Trace a copy of ``model`` and run fxmobile's FX passes on it.

    ``model`` is never modified. ``example_inputs`` (a tensor or a tuple of inputs) enables the
    passes that need shapes and a numerical check of the result against eager, in
    ``result.report.numerics``; ``check`` says what a mismatch does ("raise", the default:
    ``NumericalMismatchError``; "warn"; "off": no check). ``blocklist`` takes
    ``fxmobile.MobileOptimizerType`` members (or upstream's ``torch._C._MobileOptimizerType``
    members) to switch passes off.
    """
    options = make_options(
        blocklist=blocklist,
        example_inputs=example_inputs,
        leaf_modules=leaf_modules,
        concrete_args=concrete_args,
        auto_leaf=auto_leaf,
        eval_copy=eval_copy,
        channels_last=channels_last,
        tolerance=tolerance,
        check=check,
    )
    admit(model, options)
    clock = _Clock()
    gm, report, expected = _fx_stage(model, options, clock)
    if options.checks:

        def rerun(observe: Observe) -> None:
            _fx_stage(model, options, _Clock(), observe=observe)

        _check(report, options, clock, expected, gm, rerun)
    clock.record(report)
    return FxResult(gm, report)


def optimize(
    module: nn.Module,
    optimization_blocklist: Iterable[BlocklistItem] | None = None,
    preserved_methods: Sequence[str] | None = None,
    backend: Backend | str = "CPU",
    *,
    example_inputs: Any = None,
    leaf_modules: Iterable[LeafSpec] = (),
    concrete_args: Mapping[str, Any] | None = None,
    auto_leaf: bool = True,
    eval_copy: bool = False,
    channels_last: bool | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    check: Check | str = Check.RAISE,
    target_runtime: str | None = None,
) -> MobileResult:
    """Optimize ``module`` for ``backend``; the module and the report of everything done.

    Arguments as ``optimize_for_mobile``; the keyword-only ones are those of ``optimize_fx``,
    except that ``channels_last`` defaults to ``None``: on for the CPU backend, whose prepacked
    kernels read and write channels-last activations (an NCHW network pays a layout change at
    every convolution and runs pooling on ATen's slow NCHW path), off for Vulkan and Metal,
    whose runtimes pick their own layout. Blocklist ``MobileOptimizerType.CHANNELS_LAST`` or
    pass ``False`` to keep eager's layout. ``target_runtime`` (a reference runtime's version,
    ``"1.13.1"`` or ``"2.12.1"``) makes ``save`` write the bytecode that runtime reads,
    refusing (``IncompatibleRuntimeError``, naming the operator) when an operator is newer.
    """
    if target_runtime is not None:
        runtime_spec(target_runtime)
    options = make_options(
        blocklist=optimization_blocklist,
        backend=backend,
        preserved_methods=preserved_methods,
        example_inputs=example_inputs,
        leaf_modules=leaf_modules,
        concrete_args=concrete_args,
        auto_leaf=auto_leaf,
        eval_copy=eval_copy,
        channels_last=channels_last,
        tolerance=tolerance,
        check=check,
    )
    if isinstance(module, torch.jit.ScriptModule):
        check_tensors(module)
    else:
        admit(module, options, needs_forward=not options.preserved_methods)
    clock = _Clock()
    scripted, report, expected = _to_script(module, options, clock)
    optimized, methods = _script_stage(scripted, options, report, target_runtime=target_runtime)
    if options.checks and not _has_forward(optimized):
        report.notes.append("numerics not checked: the module has no forward to run")
    elif options.checks and not _runs_here(optimized, methods):
        report.notes.append(
            "numerics not checked: the module moves tensors to the Vulkan device; blocklist "
            "MobileOptimizerType.VULKAN_AUTOMATIC_GPU_TRANSFER to check them on this machine"
        )
    elif options.checks:
        _check(report, options, clock, expected, optimized, lambda o: _rerun(module, options, o))
    clock.record(report)
    return MobileResult(optimized, report, target_runtime)


def optimize_for_mobile(
    module: nn.Module,
    optimization_blocklist: Iterable[BlocklistItem] | None = None,
    preserved_methods: Sequence[str] | None = None,
    backend: Backend | str = "CPU",
    *,
    example_inputs: Any = None,
    **fx_options: Any,
) -> torch.jit.ScriptModule:
    """Drop-in for ``torch.utils.mobile_optimizer.optimize_for_mobile`` that works without
    XNNPACK, and also takes eager modules; see ``optimize`` for the report."""
    return optimize(
        module,
        optimization_blocklist,
        preserved_methods,
        backend,
        example_inputs=example_inputs,
        **fx_options,
    ).module


class _Clock:
    """Optimization time and check time, apart (the report shows both)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.checking = 0.0

    def check(self, run: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return run()
        finally:
            self.checking += time.perf_counter() - start

    def record(self, report: Report) -> None:
        total = time.perf_counter() - self.start
        report.optimize_seconds = total - self.checking
        report.check_seconds = self.checking


# Given a stage's name ("fx", "script"), the observer a re-run of that stage reports to.
Observe = Callable[[str], Observer]


def _fx_stage(
    model: nn.Module,
    options: Options,
    clock: _Clock,
    *,
    for_script: bool = False,
    observe: Observe | None = None,
) -> tuple[fx.GraphModule, Report, Any]:
    """Capture and the FX passes; the graph module, its report and eager's outputs (None
    without a check, or in a re-run: ``observe`` set)."""
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
    gm, records = manager.run(captured.graph_module)
    report.passes.extend(records)
    return gm, report, expected


def _to_script(
    module: nn.Module, options: Options, clock: _Clock, observe: Observe | None = None
) -> tuple[torch.jit.ScriptModule, Report, Any]:
    """The module as TorchScript for the TorchScript stage, the report so far, and the
    unoptimized model's outputs (None without a check, or in a re-run)."""
    if isinstance(module, torch.jit.ScriptModule):
        report = Report(model_name=str(module.original_name))
        # copies of the caller's state: eval() and the passes must not reach it, and the
        # reference runs on a copy of its own (a forward may write its buffers)
        scripted = clone_script_module(module)
        reference: Any = clone_script_module(module)
    elif options.preserved_methods or not has_forward(module):
        reference = deep_copy(module).eval()
        # torch.fx traces forward only; exported methods need the scripted original.
        scripted = quietly_script(copy.deepcopy(reference))
        report = Report(model_name=type(module).__name__)
        report.notes.append(
            "FX stage skipped: torch.fx traces forward only, and preserved methods "
            "need the scripted original"
        )
    else:
        try:
            gm, report, expected = _fx_stage(
                module, options, clock, for_script=True, observe=observe
            )
        except RefusedError:
            raise
        except CaptureError as declined:
            return _fallback(module, options, clock, declined, observe)
        scripted, note = to_torchscript(gm, options.example_inputs)
        if note:
            report.notes.append(note)
        if observe is not None:
            observe("script")("torchscript", scripted)
        return scripted, report, expected
    report.route = "TorchScript input"
    expected = None
    if options.checks and observe is None and _has_forward(scripted):
        args, kwargs = eager_arguments(
            reference, options.example_inputs or (), _specialized(options)
        )
        expected, _ = clock.check(
            lambda: reference_outputs(reference, report.model_name, args, kwargs)
        )
    return scripted, report, expected


def _fallback(
    module: nn.Module,
    options: Options,
    clock: _Clock,
    declined: CaptureError,
    observe: Observe | None,
) -> tuple[torch.jit.ScriptModule, Report, Any]:
    """torch.jit.trace or torch.jit.script, where torch.fx could not capture the model.

    The reference is two calls of a fresh copy, and the check runs the result twice: a model
    whose output depends on state kept between calls (which tracing bakes in) then differs.
    """
    fallback = fallback_to_torchscript(module, options.example_inputs)
    report = Report(model_name=type(module).__name__, route=fallback.route)
    report.hooks = fallback_hook_records(module, fallback.route)
    report.declined = [f"torch.fx: {declined}", *fallback.declined]
    report.notes.extend(fallback.notes)
    expected = None
    if options.checks and observe is None:
        reference = deep_copy(module).eval()
        args, kwargs = eager_arguments(
            reference, options.example_inputs or (), _specialized(options)
        )
        name = type(module).__name__
        expected = clock.check(
            lambda: tuple(reference_outputs(reference, name, args, kwargs)[0] for _ in range(2))
        )
    if observe is not None:
        observe("script")(fallback.route, fallback.module)
    return fallback.module, report, expected


def _script_stage(
    scripted: torch.jit.ScriptModule,
    options: Options,
    report: Report,
    observe: Observe | None = None,
    target_runtime: str | None = None,
) -> tuple[torch.jit.ScriptModule, list[str]]:
    """Freeze and rewrite ``scripted`` (fxmobile's own copy, never the caller's module: see
    ``_to_script``) for ``options.backend``; the module and the methods that were rewritten.
    The report gains the passes, op counts, lints and size."""
    assert options.backend is not None
    # Graphs are shared with other instances of the same types until the first freeze: passes
    # before it only use torch passes that clone.
    scripted.eval()
    preserved_attrs = _check_preserved(scripted, list(options.preserved_methods))
    methods = existing_methods(scripted, ["forward", *options.preserved_methods])
    missing = frozenset(runtime_spec(target_runtime).lacks) if target_runtime else frozenset()
    ctx = ScriptContext(tuple(methods), tuple(preserved_attrs), options.example_inputs, missing)
    spec = backend_spec(options.backend)
    ensure_registered(spec.op_family)
    blocked = options.blocklist if spec.honours is None else options.blocklist & spec.honours
    if not options.channels_last:  # channels_last=False reaches the TorchScript-level layout too
        blocked = blocked | {MobileOptimizerType.CHANNELS_LAST}
    report.backend = options.backend.name
    report.ops_before = dict(op_histogram(scripted, methods))
    observer = observe("script") if observe else None
    manager = PassManager(spec.passes(), ScriptStage(ctx), ctx, blocked, observer=observer)
    optimized, records = manager.run(scripted)
    for name, value in spec.markers.items():
        optimized._c._register_attribute(name, torch._C.BoolType.get(), value)
    report.passes.extend(records)
    report.ops_after = dict(op_histogram(optimized, methods))
    report.unfused_ops = dict(unfused_ops(optimized, methods))
    report.measure_file_with(lambda: file_facts(lite_file(optimized, target_runtime)))
    report.lints = generate_mobile_module_lints(optimized)
    return optimized, methods


def _check(
    report: Report,
    options: Options,
    clock: _Clock,
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
    actual = clock.check(lambda: run_calls(result, inputs, calls))
    report.numerics = compare_outputs(expected, actual, options.tolerance)

    def observe(stage: str) -> Observer:
        return divergence_observer(expected, inputs, options.tolerance, stage, calls)

    enforce(report, options.check, lambda: first_divergence(lambda: rerun(observe)))


FALLBACK_ROUTES = frozenset({"torch.jit.trace", "torch.jit.script"})


def _rerun(module: nn.Module, options: Options, observe: Observe) -> None:
    """The whole pipeline once more, every pass observed (the report is thrown away)."""
    scripted, report, _ = _to_script(module, options, _Clock(), observe)
    _script_stage(scripted, options, report, observe)


def lite_file(module: torch.jit.ScriptModule, target_runtime: str | None) -> bytes:
    """The lite-interpreter file of ``module``, backported for ``target_runtime`` if needed."""
    data = lite_interpreter_bytes(module)
    return data if target_runtime is None else backport_for(target_runtime, data)


def file_facts(data: bytes) -> FileFacts:
    """Size and mobile compatibility of a lite-interpreter file."""
    return FileFacts(len(data), file_compatibility(data).to_dict())


def _specialized(options: Options) -> dict[str, Any]:
    """The concrete arguments that are values (``fx.PH`` keeps a parameter an input)."""
    return {k: v for k, v in (options.concrete_args or {}).items() if v is not fx.PH}


def _check_preserved(module: torch.jit.ScriptModule, preserved: list[str]) -> list[str]:
    """Upstream's rules: bundled-input attributes are kept when all exist; every preserved
    name must exist, or ``AttributeError`` names the missing ones."""
    bundled = bundled_inputs_attributes(module, preserved)
    names = list(preserved)
    if all(hasattr(module, attr) for attr in bundled):
        names = list(dict.fromkeys(names + bundled))
    missing = [name for name in names if not hasattr(module, name)]
    if missing:
        raise AttributeError(
            "The following methods to preserve do not exist in script_module: " + ", ".join(missing)
        )
    return names


def _has_forward(module: torch.jit.ScriptModule) -> bool:
    return bool(module._c._has_method("forward"))


def _runs_here(module: torch.jit.ScriptModule, methods: list[str]) -> bool:
    """False when the graph moves tensors to the Vulkan device, which this build cannot run."""
    for name in methods:
        for node in module._c._get_method(name).graph.findAllNodes("aten::to"):
            for value in node.inputs():
                if value.node().kind() != "prim::Constant":
                    continue
                device = value.toIValue()
                if isinstance(device, torch.device) and device.type == "vulkan":
                    return False
    return True
