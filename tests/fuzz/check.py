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
import warnings
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, event, settings
from hypothesis.errors import HypothesisException
from torch import nn

import fxmobile
from fxmobile.options import tolerance_for
from tests.fuzz.build import FuzzModel, build
from tests.fuzz.dynamic import (
    assert_counters_match,
    counter_paths,
    live_random_blocks,
    random_calls_left,
)
from tests.fuzz.expect import documented_refusals, gate_may_fire, refused_by_the_gate
from tests.fuzz.findings import open_finding
from tests.fuzz.hooks import global_hook, hook_calls
from tests.fuzz.layers import clear_caches
from tests.fuzz.oracle import (
    assert_close_to_anchor,
    in_dtype,
    outputs_and_results,
    results,
    rounding_noise,
    run,
)
from tests.fuzz.outputs import structure
from tests.fuzz.probes import check_probe
from tests.fuzz.script_structure import check_script_structure
from tests.fuzz.spec import PRODUCERS, Kind, ModelSpec, example_input
from tests.fuzz.structure import (
    _has_running_stats,
    check_hook_report,
    check_structure,
    foldable_into_producer,
    kept_hook_sites,
    live_values,
    needed_batch_stats,
)
from tests.fuzz.untouched import Untouched
from tests.test_no_mutation import assert_outputs_identical, assert_shares_no_storage

# make test's profile: 150 models per stage, about 0.5 s each on one free core (issue budget:
# make test under 20 minutes); make fuzz-long and FXMOBILE_FUZZ_EXAMPLES run more.
DEFAULT_EXAMPLES = 150
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


STAGES = [pytest.param(stage, id=stage.value) for stage in Stage]


@dataclass(frozen=True)
class Optimized:
    """What a stage returned: the module, its report, and the warning fxmobile's own check gave
    (its gate runs with ``check="warn"``: the fuzzer's oracle is the judge)."""

    module: Any
    report: fxmobile.Report
    gate_warning: str | None


def optimize(stage: Stage, model: nn.Module, x: torch.Tensor, spec: ModelSpec) -> Optimized:
    """``model`` through ``stage``, with fxmobile's gate set to warn (``check="warn"``): a
    mismatch it finds comes back as its message, naming the first pass that diverged. torch's
    global module hook ``spec.global_hook`` is registered meanwhile."""
    with warnings.catch_warnings(record=True) as caught, global_hook(spec.global_hook):
        warnings.simplefilter("always")
        if stage is Stage.SCRIPT_CPU:
            mobile = fxmobile.optimize(model, example_inputs=x, backend="CPU", check="warn")
            module: Any = mobile.module
            report = mobile.report
        else:
            channels_last = stage is Stage.FX_CHANNELS_LAST
            result = fxmobile.optimize_fx(model, x, channels_last=channels_last, check="warn")
            module, report = result.graph_module, result.report
    gate = [str(w.message) for w in caught if "does not match eager" in str(w.message)]
    return Optimized(module, report, gate[0] if gate else None)


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
        if b.kind is Kind.BRANCH:
            event(f"branch on the {b.options['on']} ({b.form})")
        if b.kind is Kind.RANDOM:
            event(f"random: {b.options['call']}")
    if spec.optional_input:
        event("optional input left at None")
    event(f"probe: {spec.probe}")


def check_model(stage: Stage, spec: ModelSpec) -> str | None:
    """Checks the model ``spec`` describes through ``stage``. None when it was optimized; the
    documented refusal's name when fxmobile refused it (any other refusal fails); the open
    finding's name when it failed as that finding does (``tests.fuzz.findings``)."""
    try:
        return _check_model(stage, spec)
    except (HypothesisException, KeyboardInterrupt):
        raise
    except Exception as exc:
        finding = open_finding(stage.value, spec, exc)
        if finding is None:
            raise
        return f"open finding {finding.name}"


def _check_model(stage: Stage, spec: ModelSpec) -> str | None:
    model = build(spec)
    eager_outputs, eager = outputs_and_results(model, spec)
    ref64 = [t.double() for t in results(in_dtype(model, torch.float64), spec, torch.float64)]
    assume(all(bool(t.isfinite().all()) for t in [*eager, *ref64]))
    noise = rounding_noise(model, spec, eager, ref64)
    eager_calls = hook_calls(model, lambda: run(model, spec))
    refusals = documented_refusals(spec, stage.value)
    if spec.cold_cache:
        clear_caches(model)  # as a model that has not run yet
    untouched = Untouched.take(model)
    given_input = example_input(spec)
    try:
        optimized = optimize(stage, model, given_input, spec)
    except fxmobile.FxMobileError as exc:
        refusal = next((r for r in refusals if r.matches(exc)), None)
        if refusal is None:
            raise AssertionError(
                f"fxmobile refused a model the docs do not document refusing: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        untouched.assert_unchanged(model)
        return refusal.name
    required = [r for r in refusals if r.required]
    assert not required, f"the docs document refusing this model ({required[0].readme})"
    untouched.assert_unchanged(model)
    assert torch.equal(given_input, example_input(spec)), "optimizing wrote to example_inputs"
    assert_counters_match(spec, model, optimized.module, "as handed back")
    assert_outputs_identical(eager, results(model, spec))
    assert_shares_no_storage(optimized.module, model)
    gate_refusal = refused_by_the_gate(stage.value, spec, optimized.gate_warning)
    if gate_refusal is not None:  # check="raise" would not have returned the module
        return gate_refusal.name
    try:
        check_results(stage, spec, model, optimized, eager_outputs, eager, ref64, noise)
        if stage is not Stage.SCRIPT_CPU:  # the optimized module calls the user's hooks
            calls = hook_calls(model, lambda: run(optimized.module, spec))
            assert calls == eager_calls, (
                f"the stateful hooks saw {calls} in the optimized module, {eager_calls} in eager"
            )
        check_idioms(spec, model, optimized)
        check_probe(spec, model, optimized.module, optimized.report.route or "", noise, ref64)
    except AssertionError as exc:
        gate = optimized.gate_warning or "passed"
        raise AssertionError(f"{exc}\nfxmobile's own check: {gate}") from exc
    if optimized.gate_warning is not None:
        scales = [float(e.double().abs().max()) if e.numel() else 0.0 for e in eager]
        tolerances = [tolerance_for(e.dtype) for e in eager]
        assert gate_may_fire(noise, scales, tolerances), (
            f"fxmobile's own check failed a model the oracle passes, whose rounding noise is "
            f"far below its tolerance: {optimized.gate_warning}"
        )
        event("fxmobile's check failed an ill-conditioned model the oracle passes")
    return None


def check_idioms(spec: ModelSpec, model: FuzzModel, optimized: Optimized) -> None:
    """What the idioms of issue 24 promise beyond the outputs: random draws stay graph
    nodes, an optional input left at None is reported, and a call counter counts on from the
    caller's state in both models alike."""
    live = live_values(spec)
    if live_random_blocks(spec, live):
        assert random_calls_left(optimized.module) >= 1, (
            "the optimized module makes no random draw where eager draws on every call (the "
            "values were baked in?)"
        )
    route = optimized.report.route or ""
    if spec.optional_input and route.startswith("torch.fx"):
        assert any("bias left at its default None" in n for n in optimized.report.notes), (
            f"the report does not say that bias was specialized away: {optimized.report.notes}"
        )
    if counter_paths(spec):
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            optimized.module(example_input(spec))
            torch.manual_seed(spec.seed)
            model(example_input(spec))
        assert_counters_match(spec, model, optimized.module, "after one call of each")


def check_results(
    stage: Stage,
    spec: ModelSpec,
    model: FuzzModel,
    optimized: Optimized,
    eager_outputs: Any,
    eager: list[torch.Tensor],
    ref64: list[torch.Tensor],
    noise: list[float],
) -> None:
    """The optimized module computes what eager computes, twice, and shows its structure."""
    got_outputs, got = outputs_and_results(optimized.module, spec)
    exact = stage is not Stage.SCRIPT_CPU  # TorchScript returns its own NamedTuple class
    assert structure(got_outputs, exact) == structure(eager_outputs, exact), (
        f"the optimized model returns {structure(got_outputs, exact)}, eager "
        f"{structure(eager_outputs, exact)}"
    )
    assert len(got) == len(ref64), "the optimized model returns a different structure"
    for i, (g, e, r, n) in enumerate(zip(got, eager, ref64, noise, strict=True)):
        # the last result is what the call left in its input (eager may write to it)
        where = "the input after the call" if i == len(got) - 1 else f"output {i}"
        assert g.dtype == e.dtype, f"{where} is {g.dtype}, eager's {e.dtype} (pytorch#76578)"
        assert_close_to_anchor(g, r, n, e.dtype, where)
    for i, (a, g) in enumerate(zip(results(optimized.module, spec), got, strict=True)):
        assert torch.equal(a, g), f"result {i} differs on a second call (pytorch/pytorch#52463)"
    check_hook_report(model, optimized.report)
    if stage is Stage.SCRIPT_CPU:
        allowed = kept_hook_sites(spec, Kind.BATCHNORM)
        check_script_structure(spec, optimized.module, allowed, needed_batch_stats(spec))
    else:
        check_structure(spec, model, optimized.module, optimized.report)
