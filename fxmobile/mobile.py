"""The TorchScript stage's entry points: ``optimize`` and the drop-in ``optimize_for_mobile``.

An eager ``nn.Module`` goes through the FX stage first, then is scripted; a ``ScriptModule``
goes through this stage only. Either way the caller's module is never modified: the stage works
on a clone, in eval mode, and the result is frozen, rewritten for the backend and marked.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fxmobile.api import check_tolerance, run_fx_stage
from fxmobile.backends.library import ensure_registered
from fxmobile.backends.registry import Backend, backend_spec
from fxmobile.capture import check_module, require_eval
from fxmobile.capture.checks import has_forward, require_forward
from fxmobile.capture.trace import LeafSpec, check_tensors, deep_copy, eager_arguments
from fxmobile.errors import InvalidArgumentError, InvalidValueError
from fxmobile.options import BlocklistItem, MobileOptimizerType, normalize_blocklist
from fxmobile.report import Report
from fxmobile.report.numerics import DEFAULT_TOLERANCE, as_input_tuple, compare_outputs, run_model
from fxmobile.script.freezing import bundled_inputs_attributes
from fxmobile.script.graph_utils import existing_methods, op_histogram, unfused_ops
from fxmobile.script.infra import ScriptContext
from fxmobile.script.lints import generate_mobile_module_lints
from fxmobile.script.manager import ScriptPassManager
from fxmobile.script.scripting import clone_script_module, quietly_script, to_torchscript
from fxmobile.script.serialization import lite_interpreter_bytes, save_for_lite_interpreter


@dataclass
class MobileResult:
    """The optimized ``ScriptModule`` and the report of both stages."""

    module: torch.jit.ScriptModule
    report: Report

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a lite-interpreter file (load it with ``_load_for_lite_interpreter``); the
        report's ``file_bytes`` is then that file's size."""
        save_for_lite_interpreter(self.module, path)
        self.report.file_bytes = os.path.getsize(path)


def optimize(
    module: nn.Module,
    optimization_blocklist: Iterable[BlocklistItem] | None = None,
    preserved_methods: Sequence[str] | None = None,
    backend: Backend | str = "CPU",
    *,
    example_inputs: Any = None,
    leaf_modules: Iterable[LeafSpec] = (),
    concrete_args: dict[str, Any] | None = None,
    auto_leaf: bool = False,
    eval_copy: bool = False,
    channels_last: bool | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> MobileResult:
    """Optimize ``module`` for ``backend``; the module and the report of everything done.

    Arguments as ``optimize_for_mobile``; the keyword-only ones are those of ``optimize_fx``,
    except that ``channels_last`` defaults to ``None``: on for the CPU backend, whose prepacked
    kernels read and write channels-last activations (an NCHW network pays a layout change at
    every convolution and runs pooling on ATen's slow NCHW path), off for Vulkan and Metal,
    whose runtimes pick their own layout. Blocklist ``MobileOptimizerType.CHANNELS_LAST`` or
    pass ``False`` to keep eager's layout.
    """
    blocked = normalize_blocklist(optimization_blocklist)
    target = Backend.parse(backend)
    preserved = _preserved_names(preserved_methods)
    check_tolerance(tolerance)
    inputs = None if example_inputs is None else as_input_tuple(example_inputs)
    notes: list[str] = []
    reference_model: Any = None  # what computes the expected outputs, when not computed yet
    expected: Any = None

    if isinstance(module, torch.jit.ScriptModule):
        check_tensors(module)
        scripted = module
        report = Report(model_name=_script_name(module))
        reference_model = clone_script_module(module)
    else:
        check_module(module)
        require_eval(module, eval_copy)
        if not preserved:
            require_forward(module)  # nothing to optimize: no forward and nothing preserved
        if preserved or not has_forward(module):
            reference_model = deep_copy(module).eval()
            # torch.fx traces forward only; exported methods need the scripted original.
            scripted = _script_eager(reference_model)
            report = Report(model_name=type(module).__name__)
            notes.append(
                "FX stage skipped: torch.fx traces forward only, and preserved methods "
                "need the scripted original"
            )
        else:
            fx_result, expected = run_fx_stage(
                module,
                inputs,
                blocklist=blocked,
                leaf_modules=leaf_modules,
                concrete_args=concrete_args,
                auto_leaf=auto_leaf,
                eval_copy=eval_copy,
                channels_last=target is Backend.CPU if channels_last is None else channels_last,
                tolerance=tolerance,
                check=False,  # the final module is checked against the same eager outputs
            )
            report = fx_result.report
            scripted, note = to_torchscript(fx_result.graph_module, inputs)
            if note:
                notes.append(note)
    # A copy of the state, so eval() cannot reach the caller's module. Graphs are shared with
    # other instances of the same types until the first freeze: passes before it only use
    # torch passes that clone (see fxmobile.script.infra).
    scripted = clone_script_module(scripted)
    scripted.eval()

    preserved_attrs = _check_preserved(scripted, preserved)
    methods = existing_methods(scripted, ["forward", *preserved])
    ctx = ScriptContext(tuple(methods), tuple(preserved_attrs), inputs)
    spec = backend_spec(target)
    ensure_registered(spec.op_family)
    honoured = blocked if spec.honours is None else blocked & spec.honours
    report.backend = target.name
    report.ops_before = dict(op_histogram(scripted, methods))
    optimized, records = ScriptPassManager(spec.passes(), ctx, honoured).run(scripted)
    for name, value in spec.markers.items():
        optimized._c._register_attribute(name, torch._C.BoolType.get(), value)
    report.passes.extend(records)
    report.ops_after = dict(op_histogram(optimized, methods))
    report.unfused_ops = dict(unfused_ops(optimized, methods))
    report.measure_file_with(lambda: len(lite_interpreter_bytes(optimized)))
    report.lints = generate_mobile_module_lints(optimized)
    report.notes.extend(notes)
    if inputs is not None and not _has_forward(optimized):
        report.notes.append("numerics not checked: the module has no forward to run")
    elif inputs is not None:
        if _runs_here(optimized, methods):
            if reference_model is not None:
                expected = _reference_outputs(reference_model, inputs, concrete_args or {})
            report.numerics = compare_outputs(expected, run_model(optimized, inputs), tolerance)
        else:
            report.numerics = None
            report.notes.append(
                "numerics not checked: the module moves tensors to the Vulkan device; blocklist "
                "MobileOptimizerType.VULKAN_AUTOMATIC_GPU_TRANSFER to check them on this machine"
            )
    return MobileResult(optimized, report)


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


def _preserved_names(preserved_methods: Sequence[str] | None) -> list[str]:
    if preserved_methods is None:
        return []
    if isinstance(preserved_methods, str | bytes):
        raise InvalidArgumentError(
            f"preserved_methods must be a list of method names, got the single name "
            f"{preserved_methods!r}; wrap it: [{preserved_methods!r}]"
        )
    # upstream converts byte strings too
    return [m.decode() if isinstance(m, bytes) else str(m) for m in preserved_methods]


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


def _script_name(module: torch.jit.ScriptModule) -> str:
    return str(module.original_name)


def _script_eager(module: nn.Module) -> torch.jit.ScriptModule:
    return quietly_script(copy.deepcopy(module))


def _specialized(concrete_args: dict[str, Any]) -> dict[str, Any]:
    import torch.fx as fx

    return {k: v for k, v in concrete_args.items() if v is not fx.PH}


def _has_forward(module: torch.jit.ScriptModule) -> bool:
    return bool(module._c._has_method("forward"))


def _reference_outputs(model: Any, inputs: tuple[Any, ...], concrete_args: dict[str, Any]) -> Any:
    """The eager (or unoptimized scripted) outputs; bad example inputs are named as such."""
    try:
        return run_model(model, *eager_arguments(model, inputs, _specialized(concrete_args)))
    except Exception as exc:
        name = _script_name(model) if isinstance(model, torch.jit.ScriptModule) else None
        name = name or type(model).__name__
        shapes = [
            tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in inputs
        ]
        first = (str(exc).strip().splitlines() or [""])[-1]
        first = first.removeprefix(f"{type(exc).__name__}: ")  # TorchScript repeats it
        raise InvalidValueError(
            f"example_inputs do not run through {name}.forward ({type(exc).__name__}: "
            f"{first}). Got {len(inputs)} input(s) {shapes}; pass example_inputs that the "
            f"unoptimized model accepts."
        ) from exc


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


__all__ = ["MobileOptimizerType", "MobileResult", "optimize", "optimize_for_mobile"]
