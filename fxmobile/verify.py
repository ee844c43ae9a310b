"""Running models to check them: the eager reference, the optimized module, and the gate.

The entry points (``fxmobile.api``) and the zoo runner share these. Outputs may be any nest of
tuples, lists and dicts; they are flattened with torch's pytree and compared leaf by leaf. The
error of each tensor output is its max absolute difference relative to the largest finite
magnitude in eager's output, so one tolerance fits outputs of any scale. NaN where eager has NaN
(and an infinity where eager has the same one) counts as equal; anywhere else it is an infinite
error, so a NaN can never pass a check.

The gate: when example inputs are given and an output differs beyond the tolerance, the entry
points raise ``NumericalMismatchError`` (``check="raise"``, the default) naming the output, its
error and the first pass after which the outputs diverge, found by running the pipeline again
pass by pass on the same inputs; ``check="warn"`` returns the module with a warning.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxmobile.errors import InputWriteError, InvalidValueError, NumericalMismatchError, user_frame
from fxmobile.infra import Observer
from fxmobile.options import Check, tolerance_for
from fxmobile.report.records import OutputCheck, Report


def clone_inputs(inputs: Any) -> Any:
    """``inputs`` with every tensor in it copied, strides included, for a call that may write
    to them."""
    return pytree.tree_map(lambda x: copy_strided(x) if isinstance(x, torch.Tensor) else x, inputs)


def copy_strided(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` with its strides. ``clone`` keeps the strides of a dense tensor
    only: a slice such as ``x[..., ::2]`` came back contiguous, so every run on the copies
    (the trace, the check) saw another layout than the caller's, and a trace of
    ``x.contiguous().add_(c)`` recorded the write as reaching ``x`` (found by the fuzzer). A
    layout whose elements overlap (an ``expand``) cannot be written into, and is cloned."""
    cloned = tensor.clone()
    if tensor.layout is not torch.strided or cloned.stride() == tensor.stride():
        return cloned
    copy = torch.empty_strided(
        tensor.size(), tensor.stride(), dtype=tensor.dtype, device=tensor.device
    )
    try:
        copy.copy_(tensor)
    except RuntimeError:  # more than one element refers to one memory location
        return cloned
    return copy.requires_grad_(tensor.requires_grad)


def run_model(
    model: Callable[..., Any], inputs: Sequence[Any], kwargs: dict[str, Any] | None = None
) -> Any:
    """Call ``model`` under ``no_grad`` on clones of ``inputs`` (a forward may write to them)."""
    cloned = clone_inputs(tuple(inputs))
    with torch.no_grad():
        return model(*cloned, **(kwargs or {}))


def reference_outputs(
    model: Callable[..., Any],
    name: str,
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
) -> tuple[Any, tuple[Any, ...]]:
    """The unoptimized model's outputs on clones of ``inputs``, and the clones as the call left
    them (a forward may write to its inputs). Inputs the model refuses are named as such."""
    cloned = clone_inputs(inputs)
    try:
        with torch.no_grad():
            return model(*cloned, **(kwargs or {})), cloned
    except Exception as exc:
        shapes = [
            tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in inputs
        ]
        first = (str(exc).strip().splitlines() or [""])[-1]
        first = first.removeprefix(f"{type(exc).__name__}: ")  # TorchScript repeats it
        what = "unoptimized" if isinstance(model, torch.jit.ScriptModule) else "eager"
        where = user_frame(exc)
        at = f" at {where}" if where else ""
        raise InvalidValueError(
            f"example_inputs do not run through {name}.forward ({type(exc).__name__}: "
            f"{first}{at}). Got {len(inputs)} input(s) {shapes}; pass example_inputs that the "
            f"{what} model accepts (if it should accept these, the model itself fails on "
            f"them: fix it there)."
        ) from exc


@contextlib.contextmanager
def seeded(seed: int = 0) -> Iterator[None]:
    """Torch's random generator seeded with ``seed`` inside, and as it was after: eager's
    reference and the optimized module draw the same numbers, and the caller's draws are
    not disturbed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def compare_outputs(
    reference: object, actual: object, tolerance: float | None
) -> list[OutputCheck]:
    """One ``OutputCheck`` per tensor leaf of ``reference``; structures must match. A
    ``tolerance`` of None is each output's dtype's (``fxmobile.options.tolerance_for``)."""
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
        error, scale = _error_and_scale(ref.detach(), act.detach())
        checks.append(
            OutputCheck(
                index=index,
                path=pytree.keystr(path) or "output",
                max_abs_error=error,
                reference_scale=scale,
                tolerance=tolerance_for(ref.dtype) if tolerance is None else tolerance,
            )
        )
    return checks


def _error_and_scale(ref: torch.Tensor, act: torch.Tensor) -> tuple[float, float]:
    """Max abs difference (NaN where eager has NaN, or the same infinity, counts as equal; a
    NaN anywhere else as an infinite error) and the largest finite magnitude of ``ref``."""
    if not ref.numel():
        return 0.0, 0.0
    ref64, act64 = ref.to(torch.float64), act.to(torch.float64)
    same = (ref64 == act64) | (ref64.isnan() & act64.isnan())
    diff = (act64 - ref64).abs().masked_fill(same, 0.0).nan_to_num(nan=float("inf"))
    finite = ref64[ref64.isfinite()]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    return float(diff.max()), scale


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
        if isinstance(b, torch.Tensor) and not same_values(b, a)
    ]
    if not written:
        return
    graph_inputs = clone_inputs(inputs)
    with torch.no_grad():
        gm(*graph_inputs)
    graph_leaves = pytree.tree_leaves(graph_inputs)
    names = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
    for i in written:
        if not same_values(graph_leaves[i], eager_leaves[i]):
            name = repr(names[i]) if len(names) == len(before) else f"#{i}"
            raise InputWriteError(
                f"{model_name}.forward writes to its input {name} in place, and torch.fx did "
                f"not capture the write (it records `x += c` on a tensor as `x = x + c`). "
                f"Fix: use the in-place method (`x.add_(c)`), or do not write to the input "
                f"(`x = x + c`)."
            )


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit the same values, NaN equal to NaN (an input may hold NaN)."""
    if torch.equal(a, b):
        return True
    return a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)


class _DivergedError(Exception):
    def __init__(self, step: str, detail: str) -> None:
        super().__init__(step)
        self.step, self.detail = step, detail


def run_calls(model: Callable[..., Any], inputs: tuple[Any, ...], calls: int = 1) -> Any:
    """One call's outputs, or a tuple of ``calls`` calls' outputs (state kept between calls
    shows as a difference in the later ones)."""
    if calls == 1:
        return run_model(model, inputs)
    return tuple(run_model(model, inputs) for _ in range(calls))


def divergence_observer(
    expected: Any,
    inputs: tuple[Any, ...],
    tolerance: float | None,
    stage: str,
    calls: int = 1,
    run: Callable[[Any, tuple[Any, ...], int], Any] = lambda unit, i, n: run_calls(unit, i, n),
) -> Observer:
    """An observer for a pipeline re-run that stops at the first pass whose unit, run on
    ``inputs`` (``calls`` times, by ``run``: the gate's, which seeds and keeps state), no
    longer matches ``expected``."""

    def observe(name: str, unit: object) -> None:
        step = f"{stage} pass {name!r}"
        try:
            runnable = _fresh(unit) if isinstance(unit, torch.jit.ScriptModule) else unit
            actual = run(runnable, inputs, calls)
            checks = compare_outputs(expected, actual, tolerance)
        except Exception as exc:
            raise _DivergedError(step, f"fails to run ({type(exc).__name__}: {exc})") from exc
        failed = [c for c in checks if not c.passed]
        if failed:
            raise _DivergedError(step, describe(failed[0]))

    return observe


def _fresh(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """A reloaded copy: TorchScript keeps each method's execution plan from its first run, so
    a module whose graphs a pass rewrote in place after that would still run the old graph."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # TorchScript's deprecation
        torch.jit.save(module, buffer)
        buffer.seek(0)
        return torch.jit.load(buffer)


def first_divergence(rerun: Callable[[], object]) -> str:
    """Where a re-run of the pipeline with divergence observers stops: ``after fx pass 'x' (...)``,
    or why it could not say."""
    try:
        rerun()
    except _DivergedError as found:
        return f"the outputs first diverge after {found.step} ({found.detail})"
    except Exception as exc:
        return f"re-running the pipeline pass by pass failed ({type(exc).__name__}: {exc})"
    return (
        "re-running the pipeline pass by pass did not reproduce the difference (every pass's "
        "output matched): the model's outputs may not be deterministic"
    )


def describe(check: OutputCheck) -> str:
    """``output[0] is off by 0.32 of eager's scale (max abs error 1.2, tolerance 0.0001)``."""
    return (
        f"{check.path} is off by {check.relative_error:.3g} of eager's scale (max abs error "
        f"{check.max_abs_error:.3g}, tolerance {check.tolerance:g})"
    )


def enforce(report: Report, check: Check, locate: Callable[[], str]) -> None:
    """The gate: nothing when every output passed; otherwise raise or warn as ``check`` says.

    ``locate`` finds where the outputs diverge (it re-runs the pipeline), so it runs only on a
    failure.
    """
    failed = [c for c in report.numerics or [] if not c.passed]
    if not failed or check is Check.OFF:
        return
    where = locate()
    report.notes.append(f"numerical check failed: {where}")
    outputs = "; ".join(describe(c) for c in failed)
    message = f"fxmobile's optimized {report.model_name} does not match eager: {outputs}; {where}."
    if report.declined:
        reasons = "; ".join(why.rstrip(".") for why in report.declined)
        message += f" It took the route {report.route}: {reasons}."
    if check is Check.WARN:
        warnings.warn(message + " Returning it anyway (check='warn').", stacklevel=3)
        return
    raise NumericalMismatchError(
        message + " The module is not returned. Blocklist the pass named above (and please "
        "report the model), or pass check='warn' to get the module anyway.",
        report,
    )


def randomize_batchnorm_statistics(
    model: nn.Module, input_shape: Sequence[int], seed: int = 0, forwards: int = 2
) -> nn.Module:
    """A few training-mode forwards on shifted, scaled noise (batch 2), then eval; in place.

    With default statistics (mean 0, var 1, weight 1, bias 0) a BatchNorm folding bug stays
    invisible. The global random state is left as it was; the model's own exception propagates
    when it does not run on ``input_shape``.
    """
    batch = (2, *input_shape[1:])
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        model.train()
        for _ in range(forwards):
            model(torch.randn(batch) * 1.5 + 0.3)
    return model.eval()
