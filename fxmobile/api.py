"""The public entry points: ``optimize_fx`` (the torch.fx stage)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxmobile.capture import capture
from fxmobile.capture.trace import LeafSpec, eager_arguments
from fxmobile.errors import CaptureError, InvalidArgumentError, InvalidValueError
from fxmobile.options import BlocklistItem, normalize_blocklist
from fxmobile.passes.manager import FxPassManager
from fxmobile.passes.pipeline import fx_pipeline
from fxmobile.report import Report
from fxmobile.report.numerics import (
    DEFAULT_TOLERANCE,
    as_input_tuple,
    clone_inputs,
    compare_outputs,
    run_model,
)


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
        reference, after_eager = _run_eager(
            captured.graph_module, captured.eager_copy, inputs, specialized
        )
        check_input_writes(captured.graph_module, type(model).__name__, inputs, after_eager)
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


def check_input_writes(
    gm: fx.GraphModule, model_name: str, inputs: tuple[Any, ...], after_eager: tuple[Any, ...]
) -> None:
    """Refuse a model whose forward writes to an input in a way the graph does not.

    torch.fx records ``x += c`` on a tensor as ``x = x + c`` (its proxies have no in-place
    operators), so the captured graph silently stops writing to the caller's tensor.
    ``after_eager`` holds eager's clones of ``inputs`` after its call; only when eager changed
    one is the graph run, and it must leave that input exactly as eager did.
    """
    before = pytree.tree_leaves(inputs)
    eager_leaves = pytree.tree_leaves(after_eager)
    written = [
        i
        for i, (b, a) in enumerate(zip(before, eager_leaves, strict=True))
        if isinstance(b, torch.Tensor) and not _same(b, a)
    ]
    if not written:
        return
    graph_inputs = clone_inputs(inputs)
    with torch.no_grad():
        gm(*graph_inputs)
    graph_leaves = pytree.tree_leaves(graph_inputs)
    names = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
    for i in written:
        if not _same(graph_leaves[i], eager_leaves[i]):
            name = repr(names[i]) if len(names) == len(before) else f"#{i}"
            raise CaptureError(
                f"{model_name}.forward writes to its input {name} in place, and torch.fx did "
                f"not capture the write (it records `x += c` on a tensor as `x = x + c`). "
                f"Fix: use the in-place method (`x.add_(c)`), or do not write to the input "
                f"(`x = x + c`)."
            )


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit the same values, NaN equal to NaN (an input may hold NaN)."""
    if torch.equal(a, b):
        return True
    return a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)


def _run_eager(
    gm: fx.GraphModule, eager: nn.Module, inputs: tuple[Any, ...], specialized: dict[str, Any]
) -> tuple[Any, tuple[Any, ...]]:
    """Eager's outputs on clones of ``inputs`` (a forward may write to them), and the clones
    as the call left them."""
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    cloned = clone_inputs(inputs)
    try:
        args, kwargs = eager_arguments(eager, cloned, specialized)
        with torch.no_grad():
            return eager(*args, **kwargs), cloned
    except Exception as exc:
        shapes = [
            tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in inputs
        ]
        raise InvalidValueError(
            f"example_inputs do not run through {type(eager).__name__}.forward "
            f"({type(exc).__name__}: {exc}). Got {len(inputs)} input(s) {shapes} for the "
            f"parameters {names}; pass example_inputs that the eager model accepts."
        ) from exc
