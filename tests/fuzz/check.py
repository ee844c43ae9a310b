"""One fuzzed model through one stage of fxmobile, against the oracle.

``check_model(stage, spec)`` builds the model ``spec`` describes, optimizes it through
``stage`` and checks that the result computes what eager computes (``tests.fuzz.oracle``), shows
the structure its passes promise (``tests.fuzz.structure``), and leaves the caller's model and
example inputs exactly as they were; or that fxmobile refused it with an ``FxMobileError`` that
names the problem.
"""

from __future__ import annotations

import enum
import os
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, event, settings
from torch import nn

import fxmobile
from fxmobile.backends.library import ExtensionUnavailableError
from fxmobile.passes.pipeline import fx_pipeline
from tests.fuzz.build import build
from tests.fuzz.oracle import (
    assert_close_to_anchor,
    in_dtype,
    results,
    rounding_noise,
)
from tests.fuzz.spec import PRODUCERS, Kind, ModelSpec, example_input
from tests.fuzz.structure import _has_running_stats, check_structure, foldable_into_producer
from tests.test_no_mutation import (
    ModelSnapshot,
    assert_outputs_identical,
    assert_shares_no_storage,
)

DEFAULT_EXAMPLES = 500
EXAMPLES = int(os.environ.get("FXMOBILE_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=EXAMPLES <= DEFAULT_EXAMPLES,
    database=None,
    deadline=None,
    print_blob=True,
    # models are drawn block by block from the shapes; a draw is large and slow by design
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Stage(enum.Enum):
    FX = "fx"  # optimize_fx
    FX_CHANNELS_LAST = "fx-channels-last"  # optimize_fx(..., channels_last=True)
    SCRIPT_CPU = "script-cpu"  # optimize(..., backend="CPU"): both stages


HAS_SCRIPT_STAGE = hasattr(fxmobile, "optimize")
HAS_CHANNELS_LAST = any(
    p.optimization is fxmobile.MobileOptimizerType.CHANNELS_LAST
    for p in fx_pipeline(channels_last=True)
)
STAGES = [
    pytest.param(Stage.FX, id="fx"),
    pytest.param(
        Stage.FX_CHANNELS_LAST,
        id="fx-channels-last",
        marks=pytest.mark.skipif(
            not HAS_CHANNELS_LAST,
            reason="optimize_fx(channels_last=True) adds no pass yet (fx_pipeline ignores it)",
        ),
    ),
    pytest.param(
        Stage.SCRIPT_CPU,
        id="script-cpu",
        marks=pytest.mark.skipif(
            not HAS_SCRIPT_STAGE,
            reason="fxmobile.optimize (the TorchScript stage) is not exported yet: only the FX "
            "stage is fuzzed",
        ),
    ),
]

# An FxMobileError that is not a refusal: a crash in a pass, a missing operator library, or the
# optimizer's own numerical check catching a miscomputation.
NOT_REFUSALS: tuple[type[Exception], ...] = (
    fxmobile.PassError,
    fxmobile.NumericalMismatchError,
    ExtensionUnavailableError,
)


def optimize(stage: Stage, model: nn.Module, x: torch.Tensor) -> tuple[Any, fxmobile.Report]:
    if stage is not Stage.SCRIPT_CPU:
        result = fxmobile.optimize_fx(model, x, channels_last=stage is Stage.FX_CHANNELS_LAST)
        return result.graph_module, result.report
    mobile = fxmobile.optimize(model, example_inputs=x, backend="CPU")
    return mobile.module, mobile.report


def report_coverage(spec: ModelSpec) -> None:
    """Hypothesis events (``--hypothesis-show-statistics``): which hazards the models had."""
    refs = spec.references()
    event(f"input: {spec.input.dims}-D {spec.layout.value} {spec.input.dtype}")
    for i, b in enumerate(spec.blocks):
        event(f"block: {b.kind.value}")
        if b.owner is not None:
            event("module or weights called at several sites")
        if b.inplace:
            event("in-place op")
        if refs[i + 1] > 1:
            event("value with several consumers")
        if foldable_into_producer(spec, b):
            event(f"BN right after {spec.blocks[b.src - 1].kind.value}, foldable")
        elif b.kind is Kind.BATCHNORM and not _has_running_stats(b):
            event("BN on batch statistics")
        if b.kind is Kind.ARITHMETIC and b.src and spec.blocks[b.src - 1].kind in PRODUCERS:
            event(f"constant {b.options['op']} after {spec.blocks[b.src - 1].kind.value}")


def check_model(stage: Stage, spec: ModelSpec) -> str | None:
    """Checks the model ``spec`` describes through ``stage``; the refusal's name if refused."""
    model = build(spec)
    snapshot = ModelSnapshot.take(model)
    eager = results(model, spec)
    ref64 = [t.double() for t in results(in_dtype(model, torch.float64), spec, torch.float64)]
    assume(all(bool(t.isfinite().all()) for t in [*eager, *ref64]))
    noise = rounding_noise(model, spec, eager, ref64)
    given_input = example_input(spec)
    try:
        optimized, report = optimize(stage, model, given_input)
    except NOT_REFUSALS:
        raise
    except fxmobile.FxMobileError as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
        snapshot.assert_unchanged(model)
        return type(exc).__name__
    snapshot.assert_unchanged(model)
    assert torch.equal(given_input, example_input(spec)), "optimizing wrote to example_inputs"
    assert_outputs_identical(eager, results(model, spec))
    assert_shares_no_storage(optimized, model)

    got = results(optimized, spec)
    assert len(got) == len(ref64), "the optimized model returns a different structure"
    for i, (g, e, r, n) in enumerate(zip(got, eager, ref64, noise, strict=True)):
        # the last result is what the call left in its input (eager may write to it)
        where = "the input after the call" if i == len(got) - 1 else f"output {i}"
        assert g.dtype == e.dtype, f"{where} is {g.dtype}, eager's {e.dtype} (pytorch#76578)"
        assert_close_to_anchor(g, r, n, e.dtype, where)
    for i, (a, g) in enumerate(zip(results(optimized, spec), got, strict=True)):
        assert torch.equal(a, g), f"result {i} differs on a second call (pytorch/pytorch#52463)"
    if stage is not Stage.SCRIPT_CPU:
        check_structure(spec, model, optimized, report)
    return None
