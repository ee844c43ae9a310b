"""The public entry points: ``optimize_fx`` (the torch.fx stage)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from fxmobile.capture import capture
from fxmobile.capture.trace import LeafSpec, eager_arguments
from fxmobile.errors import InvalidArgumentError, InvalidValueError
from fxmobile.options import BlocklistItem, normalize_blocklist
from fxmobile.passes.manager import FxPassManager
from fxmobile.passes.pipeline import fx_pipeline
from fxmobile.report import Report
from fxmobile.report.numerics import DEFAULT_TOLERANCE, as_input_tuple, compare_outputs, run_model


@dataclass
class FxResult:
    """The optimized ``GraphModule`` and the report of how it was made."""

    graph_module: fx.GraphModule
    report: Report


def optimize_fx(
    model: nn.Module,
    example_inputs: Any = None,
    *,
    blocklist: Iterable[BlocklistItem] | None = None,
    leaf_modules: Iterable[LeafSpec] = (),
    concrete_args: dict[str, Any] | None = None,
    auto_leaf: bool = False,
    eval_copy: bool = False,
    channels_last: bool = False,
    tolerance: float = DEFAULT_TOLERANCE,
) -> FxResult:
    """Trace a copy of ``model`` and run fxmobile's FX passes on it.

    ``model`` is never modified. ``example_inputs`` (a tensor or a tuple of inputs) enables the
    passes that need shapes and a numerical check of the result against eager; the check is in
    ``result.report.numerics``. ``blocklist`` takes ``fxmobile.MobileOptimizerType`` members (or
    upstream's ``torch._C._MobileOptimizerType`` members) to switch passes off.
    """
    result, _ = run_fx_stage(
        model,
        example_inputs,
        blocklist=blocklist,
        leaf_modules=leaf_modules,
        concrete_args=concrete_args,
        auto_leaf=auto_leaf,
        eval_copy=eval_copy,
        channels_last=channels_last,
        tolerance=tolerance,
        check=True,
    )
    return result


def run_fx_stage(
    model: nn.Module,
    example_inputs: Any,
    *,
    blocklist: Iterable[BlocklistItem] | None,
    leaf_modules: Iterable[LeafSpec],
    concrete_args: dict[str, Any] | None,
    auto_leaf: bool,
    eval_copy: bool,
    channels_last: bool,
    tolerance: float,
    check: bool,
) -> tuple[FxResult, Any]:
    """``optimize_fx``, and the eager outputs on the example inputs (None without inputs).

    With ``check=False`` the graph module is not run: ``fxmobile.optimize`` compares its final
    module against the same eager outputs instead, which checks both stages in one run.
    """
    blocked = normalize_blocklist(blocklist)
    check_tolerance(tolerance)
    captured = capture(
        model,
        leaf_modules=leaf_modules,
        concrete_args=concrete_args,
        auto_leaf=auto_leaf,
        eval_copy=eval_copy,
    )
    inputs = None if example_inputs is None else as_input_tuple(example_inputs)
    reference = None
    if inputs is not None:
        # The eager copy, before any pass touches the parameters it shares with the graph.
        specialized = {k: v for k, v in (concrete_args or {}).items() if v is not fx.PH}
        reference = _run_eager(captured.graph_module, captured.eager_copy, inputs, specialized)
    report = Report(model_name=type(model).__name__, notes=list(captured.notes))
    manager = FxPassManager(fx_pipeline(channels_last=channels_last), blocked, inputs)
    gm, records = manager.run(captured.graph_module)
    report.passes.extend(records)
    if inputs is not None and check:
        report.numerics = compare_outputs(reference, run_model(gm, inputs), float(tolerance))
    return FxResult(gm, report), reference


def check_tolerance(tolerance: object) -> None:
    """A number (TypeError otherwise) that is finite-or-infinite, not NaN and not negative."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, float | int):
        raise InvalidArgumentError(
            f"tolerance must be a non-negative number (relative error, e.g. 1e-4), got "
            f"{type(tolerance).__name__} {tolerance!r}"
        )
    if not tolerance >= 0:  # also catches NaN
        raise InvalidValueError(
            f"tolerance must be a non-negative number (relative error, e.g. 1e-4), got "
            f"{tolerance!r}; pass tolerance=0 for exact equality"
        )


def _run_eager(
    gm: fx.GraphModule, eager: nn.Module, inputs: tuple[Any, ...], specialized: dict[str, Any]
) -> Any:
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        return run_model(eager, *eager_arguments(eager, inputs, specialized))
    except Exception as exc:
        shapes = [
            tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in inputs
        ]
        raise InvalidValueError(
            f"example_inputs do not run through {type(eager).__name__}.forward "
            f"({type(exc).__name__}: {exc}). Got {len(inputs)} input(s) {shapes} for the "
            f"parameters {names}; pass example_inputs that the eager model accepts."
        ) from exc
