"""The public entry points: ``optimize_fx``, ``optimize`` and the drop-in ``optimize_for_mobile``.

Each validates its arguments once, into ``fxmobile.options.Options`` (and the model, with
``fxmobile.capture.admit``), then runs the stages, which trust what they are given:

- an eager ``nn.Module`` is captured with torch.fx and goes through the FX passes
  (``optimize_fx`` stops there, ``fx_flow``), then is scripted and rewritten for the backend
  (``script_flow``);
- a ``ScriptModule`` (or an eager model with preserved methods) enters at the TorchScript stage.

The caller's module is never modified. With example inputs, the result is checked against the
unoptimized model (``gate``): by default a mismatch raises ``NumericalMismatchError`` naming the
first pass after which the outputs diverge.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import torch
from torch import nn

from fxmobile.api import gate, program_flow, script_flow
from fxmobile.api.fx_flow import Clock, Observe, fx_stage
from fxmobile.api.results import FxResult, MobileResult, ProgramResult, lite_file
from fxmobile.capture import admit
from fxmobile.capture.checks import admit_script_module
from fxmobile.errors import InvalidArgumentError, InvalidValueError
from fxmobile.options import (
    Backend,
    BlocklistItem,
    Check,
    LeafSpec,
    Options,
    make_options,
)
from fxmobile.runtime.process import runtime_spec

__all__ = [
    "FxResult",
    "MobileResult",
    "ProgramResult",
    "lite_file",
    "optimize",
    "optimize_for_mobile",
    "optimize_fx",
]

F = TypeVar("F", bound=Callable[..., Any])

# ``target_runtime`` for an ExecuTorch program (a ``.pte`` file) instead of a lite-interpreter file.
EXECUTORCH = "executorch"

# Names other tools give an option, and fxmobile's one spelling of it.
_OTHER_SPELLINGS = {"optimization_blocklist": "blocklist"}


def _arguments_named(fn: F) -> F:
    """Refuse an unknown keyword argument with the spelling fxmobile uses, before the call.

    Python's own ``TypeError`` names the stray argument but not the right one; an option
    spelled as upstream or another entry point spells it gets the one name fxmobile uses.
    """
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            names = list(signature.parameters)
            stray = [k for k in kwargs if k not in names]
            if not stray:
                raise InvalidArgumentError(f"{fn.__name__}(): {exc}") from None
            hint = _OTHER_SPELLINGS.get(stray[0]) or next(
                iter(difflib.get_close_matches(stray[0], names, n=1)), None
            )
            fix = f"; did you mean {hint}=?" if hint else f"; its options: {', '.join(names)}"
            raise InvalidArgumentError(f"{fn.__name__}() has no option {stray[0]!r}{fix}") from None
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]


@_arguments_named
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
    tolerance: float | None = None,
    check: Check | str = Check.RAISE,
) -> FxResult:
    """Trace a copy of ``model`` and run fxmobile's FX passes on it.

    ``model`` is never modified. ``example_inputs`` (a tensor or a tuple of inputs) enables the
    passes that need shapes and a numerical check of the result against eager, in
    ``result.report.numerics``; ``check`` says what a mismatch does ("raise", the default:
    ``NumericalMismatchError``; "warn"; "off": no check). ``tolerance`` is the largest error
    allowed, relative to the largest magnitude of eager's output, for every output; ``None``
    (the default) picks it by each output's dtype, as torch.testing does
    (``fxmobile.options.tolerance_for``). ``blocklist`` takes
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
    clock = Clock()
    gm, report, expected = fx_stage(model, options, clock)
    if options.checks:

        def rerun(observe: Observe) -> None:
            fx_stage(model, options, Clock(), observe=observe)

        gate.check(report, options, clock, expected, gm, rerun)
    clock.record(report)
    return FxResult(gm, report)


@overload
def optimize(  # type: ignore[overload-overlap]  # "executorch" is a str: the first wins, as meant
    module: nn.Module,
    blocklist: Iterable[BlocklistItem] | None = None,
    preserved_methods: Sequence[str] | None = None,
    backend: Backend | str = "CPU",
    *,
    example_inputs: Any = None,
    leaf_modules: Iterable[LeafSpec] = (),
    concrete_args: Mapping[str, Any] | None = None,
    auto_leaf: bool = True,
    eval_copy: bool = False,
    channels_last: bool | None = None,
    tolerance: float | None = None,
    check: Check | str = Check.RAISE,
    target_runtime: Literal["executorch"],
) -> ProgramResult: ...


@overload
def optimize(
    module: nn.Module,
    blocklist: Iterable[BlocklistItem] | None = None,
    preserved_methods: Sequence[str] | None = None,
    backend: Backend | str = "CPU",
    *,
    example_inputs: Any = None,
    leaf_modules: Iterable[LeafSpec] = (),
    concrete_args: Mapping[str, Any] | None = None,
    auto_leaf: bool = True,
    eval_copy: bool = False,
    channels_last: bool | None = None,
    tolerance: float | None = None,
    check: Check | str = Check.RAISE,
    target_runtime: str | None = None,
) -> MobileResult: ...


@_arguments_named
def optimize(
    module: nn.Module,
    blocklist: Iterable[BlocklistItem] | None = None,
    preserved_methods: Sequence[str] | None = None,
    backend: Backend | str = "CPU",
    *,
    example_inputs: Any = None,
    leaf_modules: Iterable[LeafSpec] = (),
    concrete_args: Mapping[str, Any] | None = None,
    auto_leaf: bool = True,
    eval_copy: bool = False,
    channels_last: bool | None = None,
    tolerance: float | None = None,
    check: Check | str = Check.RAISE,
    target_runtime: str | None = None,
) -> MobileResult | ProgramResult:
    """Optimize ``module`` for ``backend``; the module and the report of everything done.

    Arguments as ``optimize_for_mobile``; the keyword-only ones are those of ``optimize_fx``,
    except that ``channels_last`` defaults to ``None``: on for the CPU backend, whose prepacked
    kernels read and write channels-last activations (an NCHW network pays a layout change at
    every convolution and runs pooling on ATen's slow NCHW path), off for Vulkan and Metal,
    whose runtimes pick their own layout. Blocklist ``MobileOptimizerType.CHANNELS_LAST`` or
    pass ``False`` to keep eager's layout. ``target_runtime`` (a reference runtime's version,
    ``"1.13.1"`` or ``"2.12.1"``) makes ``save`` write the bytecode that runtime reads,
    refusing (``IncompatibleRuntimeError``, naming the operator) when an operator is newer.

    ``target_runtime="executorch"`` makes an ExecuTorch program for the XNNPACK delegate
    instead (a ``ProgramResult``; ``save`` writes the ``.pte``), checked in ExecuTorch's
    runtime; it needs ``example_inputs`` and the CPU backend, and takes an eager model.
    """
    if isinstance(target_runtime, str) and target_runtime.lower() == EXECUTORCH:
        return _program(
            module,
            make_options(
                blocklist=blocklist,
                backend=backend,
                preserved_methods=preserved_methods,
                example_inputs=example_inputs,
                leaf_modules=leaf_modules,
                concrete_args=concrete_args,
                auto_leaf=auto_leaf,
                eval_copy=eval_copy,
                channels_last=bool(channels_last),
                tolerance=tolerance,
                check=check,
            ),
        )
    if target_runtime is not None:
        runtime_spec(target_runtime)
    options = make_options(
        blocklist=blocklist,
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
        admit_script_module(module, options)
    else:
        admit(module, options, needs_forward=not options.preserved_methods)
    clock = Clock()
    scripted, report, expected = script_flow.to_script(module, options, clock)
    optimized, methods = script_flow.script_stage(
        scripted, options, report, target_runtime=target_runtime
    )
    if options.checks and not script_flow.has_method(optimized, "forward"):
        report.notes.append("numerics not checked: the module has no forward to run")
    elif options.checks and not script_flow.runs_here(optimized, methods):
        report.notes.append(
            "numerics not checked: the module moves tensors to the Vulkan device; blocklist "
            "MobileOptimizerType.VULKAN_AUTOMATIC_GPU_TRANSFER to check them on this machine"
        )
    elif options.checks:

        def rerun(observe: Observe) -> None:
            script_flow.rerun(module, options, observe)

        gate.check(report, options, clock, expected, optimized, rerun)
    clock.record(report)
    return MobileResult(optimized, report, target_runtime)


def _program(module: nn.Module, options: Options) -> ProgramResult:
    """The ExecuTorch target: refusals of what it cannot take, then the program and its gate."""
    if isinstance(module, torch.jit.ScriptModule):
        raise InvalidArgumentError(
            "a ScriptModule cannot become an ExecuTorch program (torch.export takes eager "
            "modules): pass the eager model, or drop target_runtime for a lite-interpreter file"
        )
    if options.backend is not Backend.CPU:
        raise InvalidValueError(
            f"target_runtime='executorch' makes programs for ExecuTorch's XNNPACK delegate, on "
            f"the CPU; got backend {options.backend.name if options.backend else None!r}. Pass "
            f"backend='CPU', or drop target_runtime for a {options.backend} lite-interpreter file"
        )
    if options.preserved_methods:
        raise InvalidValueError(
            "target_runtime='executorch' exports forward only; preserved_methods need the "
            "lite-interpreter file (drop target_runtime)"
        )
    if options.example_inputs is None:
        raise InvalidValueError(
            "target_runtime='executorch' needs example_inputs: torch.export traces the model "
            "with them, and the program is checked on them"
        )
    admit(module, options)
    clock = Clock()
    lowered, runner, report, expected = program_flow.to_program(module, options, clock)
    if options.checks:

        def rerun(observe: Observe) -> None:
            program_flow.rerun(module, options, observe)

        gate.check(report, options, clock, expected, runner, rerun)
    clock.record(report)
    return ProgramResult(lowered.program, lowered.buffer, report, runner)


def optimize_for_mobile(
    module: nn.Module,
    blocklist: Iterable[BlocklistItem] | None = None,
    preserved_methods: Sequence[str] | None = None,
    backend: Backend | str = "CPU",
    *,
    example_inputs: Any = None,
    optimization_blocklist: Iterable[BlocklistItem] | None = None,
    **options: Any,
) -> torch.jit.ScriptModule:
    """Drop-in for ``torch.utils.mobile_optimizer.optimize_for_mobile`` that works without
    XNNPACK, and also takes eager modules; see ``optimize`` for the report and ``options``.

    The blocklist is positional, as upstream's; by keyword it is ``blocklist``, or upstream's
    ``optimization_blocklist``, so code written for upstream runs unchanged.
    """
    if optimization_blocklist is not None:
        if blocklist is not None:
            raise InvalidArgumentError(
                "optimize_for_mobile() got both blocklist and optimization_blocklist (upstream's "
                "name for it); pass one"
            )
        blocklist = optimization_blocklist
    return optimize(
        module,
        blocklist,
        preserved_methods,
        backend,
        example_inputs=example_inputs,
        **options,
    ).module
