"""The numerical check: the optimized model's outputs against eager, output by output.

Outputs may be any nest of tuples, lists and dicts; they are flattened with torch's pytree and
compared leaf by leaf. The error of each tensor output is its max absolute difference relative
to the largest magnitude in the eager output, so one tolerance fits outputs of any scale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fxmobile.errors import InvalidValueError
from fxmobile.report.records import OutputCheck

DEFAULT_TOLERANCE = 1e-4


def as_input_tuple(example_inputs: object) -> tuple[Any, ...]:
    """A single tensor becomes a 1-tuple; a tuple or list becomes a tuple.

    Tensors off the CPU are refused: the model is optimized and checked on the CPU.
    """
    if isinstance(example_inputs, tuple):
        inputs = example_inputs
    elif isinstance(example_inputs, list):
        inputs = tuple(example_inputs)
    else:
        inputs = (example_inputs,)
    for path, leaf in pytree.tree_flatten_with_path(inputs)[0]:
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "cpu":
            raise InvalidValueError(
                f"example_inputs{pytree.keystr(path)} is on {leaf.device}; fxmobile optimizes "
                f"the model on the CPU and checks it there. Fix: pass CPU tensors (x.cpu())."
            )
    return inputs


def compare_outputs(
    reference: object, actual: object, tolerance: float = DEFAULT_TOLERANCE
) -> list[OutputCheck]:
    """One ``OutputCheck`` per tensor leaf of ``reference``; structures must match."""
    ref_leaves, ref_spec = pytree.tree_flatten_with_path(reference)
    act_leaves, act_spec = pytree.tree_flatten_with_path(actual)
    if [p for p, _ in ref_leaves] != [p for p, _ in act_leaves]:
        raise InvalidValueError(
            f"the optimized model returns a different output structure than eager: "
            f"{act_spec} instead of {ref_spec}"
        )
    checks = []
    for index, ((path, ref), (_, act)) in enumerate(zip(ref_leaves, act_leaves, strict=True)):
        if not isinstance(ref, torch.Tensor):
            continue
        if not isinstance(act, torch.Tensor) or act.shape != ref.shape:
            raise InvalidValueError(
                f"output {pytree.keystr(path) or index} has shape "
                f"{getattr(act, 'shape', type(act).__name__)} after optimization, "
                f"{tuple(ref.shape)} in eager"
            )
        ref64 = ref.detach().to(torch.float64)
        diff = (act.detach().to(torch.float64) - ref64).abs()
        checks.append(
            OutputCheck(
                index=index,
                path=pytree.keystr(path) or "output",
                max_abs_error=float(diff.max()) if diff.numel() else 0.0,
                reference_scale=float(ref64.abs().max()) if ref64.numel() else 0.0,
                tolerance=tolerance,
            )
        )
    return checks


def clone_inputs(inputs: Any) -> Any:
    """``inputs`` with every tensor in it cloned, for a call that may write to them."""
    return pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, inputs)


def run_model(
    model: Callable[..., Any], inputs: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> Any:
    """Call ``model`` under ``no_grad`` on clones of ``inputs`` (a forward may write to them)."""
    cloned = clone_inputs(inputs)
    with torch.no_grad():
        return model(*cloned, **(kwargs or {}))
