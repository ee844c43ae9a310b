"""The TorchScript half of ``optimize``: the module as TorchScript, then the backend's passes.

An eager model is captured and goes through the FX passes, then is scripted; where torch.fx
cannot capture it, ``torch.jit.trace`` or ``torch.jit.script`` takes it whole. A ``ScriptModule``
(or an eager model with preserved methods, which torch.fx cannot trace) enters at the
TorchScript stage: a clone in eval mode is frozen, rewritten for the backend and marked.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import torch
from torch import nn

from fxmobile.api.fx_flow import Clock, Observe, fx_stage, rng_kept
from fxmobile.api.results import file_facts, lite_file
from fxmobile.backends.library import ensure_registered
from fxmobile.backends.registry import backend_spec
from fxmobile.capture.checks import deep_copy, eager_arguments, has_forward
from fxmobile.capture.hooks import fallback_hook_records
from fxmobile.capture.reference import Reference, eager_reference
from fxmobile.capture.state import match_caller
from fxmobile.errors import CaptureError, RefusedError
from fxmobile.infra import PassManager
from fxmobile.options import MobileOptimizerType, Options
from fxmobile.progress import phase
from fxmobile.report import Report
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
from fxmobile.script.stage import ScriptContext, ScriptStage


def to_script(
    module: nn.Module, options: Options, clock: Clock, observe: Observe | None = None
) -> tuple[torch.jit.ScriptModule, Report, Any]:
    """The module as TorchScript for the TorchScript stage, the report so far, and the
    unoptimized model's outputs on each input set the gate checks (a ``Reference``; None
    without a check, or in a re-run)."""
    if isinstance(module, torch.jit.ScriptModule):
        report = Report(model_name=str(module.original_name))
        # copies of the caller's state: eval() and the passes must not reach it, and the
        # reference runs on a copy of its own (a forward may write its buffers), in eval mode
        # as the optimized module is (admission refused a module whose forward depends on it)
        scripted = clone_script_module(module)
        reference: Any = clone_script_module(module).eval()
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
            gm, report, expected = fx_stage(
                module, options, clock, for_script=True, observe=observe
            )
        except RefusedError:
            raise
        except CaptureError as declined:
            return _fallback(module, options, clock, declined, observe)
        with phase("scripting"), rng_kept():
            scripted, note = to_torchscript(gm, options.example_inputs)
        if note:
            report.notes.append(note)
        if observe is not None:
            observe("script")("torchscript", scripted)
        return _made_from(scripted, module), report, expected
    report.route = "TorchScript input"
    expected = None
    if options.checks and observe is None and has_method(scripted, "forward"):
        expected = _eager_reference(reference, module, options, clock)
    return _made_from(scripted, module), report, expected


def _eager_reference(
    reference: nn.Module, caller: nn.Module, options: Options, clock: Clock, calls: int = 1
) -> Reference:
    """Eager's outputs on each input set the gate checks, on ``reference`` (a copy of
    ``caller``), counted as checking time."""
    inputs = options.example_inputs
    assert inputs is not None  # options.checks

    def arguments(inputs: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return eager_arguments(reference, inputs, options.specialized_args)

    found: Reference = clock.check(
        lambda: eager_reference(reference, caller, inputs, arguments, calls)[0]
    )
    return found


# The caller's model of each module ``to_script`` made: ``script_stage`` sets the state
# fxmobile's runs changed (a trace, the probes) back from it (``fxmobile.capture.state``).
_CALLERS: weakref.WeakKeyDictionary[torch.jit.ScriptModule, nn.Module] = weakref.WeakKeyDictionary()


def _made_from(scripted: torch.jit.ScriptModule, caller: nn.Module) -> torch.jit.ScriptModule:
    _CALLERS[scripted] = caller
    return scripted


def _fallback(
    module: nn.Module,
    options: Options,
    clock: Clock,
    declined: CaptureError,
    observe: Observe | None,
) -> tuple[torch.jit.ScriptModule, Report, Any]:
    """torch.jit.trace or torch.jit.script, where torch.fx could not capture the model.

    The reference is two calls of a fresh copy, and the check runs the result twice: a model
    whose output depends on state kept between calls (which tracing bakes in) then differs.
    """
    with phase("torch.jit.trace / torch.jit.script"), rng_kept():
        fallback = fallback_to_torchscript(module, options.example_inputs)
    report = Report(model_name=type(module).__name__, route=fallback.route)
    report.hooks = fallback_hook_records(module, fallback.route)
    report.declined = [f"torch.fx: {declined}", *fallback.declined]
    report.notes.extend(fallback.notes)
    expected = None
    if options.checks and observe is None:
        expected = _eager_reference(deep_copy(module).eval(), module, options, clock, calls=2)
    if observe is not None:
        observe("script")(fallback.route, fallback.module)
    return _made_from(fallback.module, module), report, expected


def script_stage(
    scripted: torch.jit.ScriptModule,
    options: Options,
    report: Report,
    observe: Observe | None = None,
    target_runtime: str | None = None,
) -> tuple[torch.jit.ScriptModule, list[str]]:
    """Freeze and rewrite ``scripted`` (fxmobile's own copy, never the caller's module: see
    ``to_script``) for ``options.backend``; the module and the methods that were rewritten.
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
    with phase("TorchScript passes"), rng_kept():
        optimized, records = manager.run(scripted)
    for name, value in spec.markers.items():
        optimized._c._register_attribute(name, torch._C.BoolType.get(), value)
    report.passes.extend(records)
    caller = _CALLERS.get(scripted)
    if caller is not None:  # what a trace or a probe ran advanced, set back
        match_caller(optimized, caller)
    report.ops_after = dict(op_histogram(optimized, methods))
    report.unfused_ops = dict(unfused_ops(optimized, methods))
    report.measure_file_with(lambda: file_facts(lite_file(optimized, target_runtime)))
    report.lints = generate_mobile_module_lints(optimized)
    return optimized, methods


def rerun(module: nn.Module, options: Options, observe: Observe) -> None:
    """The whole pipeline once more, every pass observed (the report is thrown away)."""
    scripted, report, _ = to_script(module, options, Clock(), observe)
    script_stage(scripted, options, report, observe)


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


def has_method(module: torch.jit.ScriptModule, name: str) -> bool:
    """Whether the compiled ``module`` has a method ``name``."""
    return bool(module._c._has_method(name))


def runs_here(module: torch.jit.ScriptModule, methods: list[str]) -> bool:
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
