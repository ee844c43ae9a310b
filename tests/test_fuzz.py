"""Differential fuzzing: fxmobile's optimized model against eager, on random valid models.

Every model ``tests.fuzz.draw.model_specs()`` draws goes through each stage (``optimize_fx``;
``optimize_fx(..., channels_last=True)``; ``fxmobile.optimize(..., backend="CPU")``, both
stages), with fxmobile's own gate set to warn (``check="warn"``: the oracle here is the judge,
and the gate's message, naming the first pass that diverged, is shown with any failure), and
must:

- compute what eager computes, in eager's dtype, within the rounding bound of
  ``assert_close_to_anchor`` (float64 anchor);
- compute the same on a second call, and do to its input what eager does (in-place ops);
- show the structure its passes promise: in the FX stages no dropout left, a BN that
  normalizes by batch statistics left alone, a BN right after a conv / linear that only it
  reads folded, a ``conv(x) * 2`` folded, a module still called at several sites untouched;
  in the CPU module no BN on running statistics, no dropout, no conv2d / linear left unpacked,
  clamps fused where they can be (``tests.fuzz.script_structure``);
- leave the caller's model and example inputs exactly as they were and share no storage
  with the model; start from the caller's call counts (a buffer forward increments), and count
  on from there as eager does; keep a random draw a graph node (eager and the optimized module,
  seeded alike, draw the same numbers); report an optional input left at None;
- on one more input drawn for the check (``tests.fuzz.probes``): the example with NaN and
  infinities (NaN and infinities where eager has them), in another memory layout, or of
  another batch size, compute what eager computes there;
- or be refused, only where the docs (``docs/pages``) document refusing such a model
  (``tests.fuzz.expect``: seed calls, generators, control flow in forward itself...): any
  other refusal, crash or exception is a failure. fxmobile's gate may fail a correct model only
  where eager's rounding noise reaches its tolerance (by the output's dtype), or where the
  docs say it refuses the model.

The models are float32, float64, float16 or bfloat16, and may branch on a value's layout, dtype
or shape, draw random numbers or seed the generator in forward, count their calls, or take an
optional input left at None (``tests.fuzz.dynamic``).

Profiles: ``make test`` runs 150 models per stage, derandomized (the same models every run).
``FXMOBILE_FUZZ_EXAMPLES=20000`` (``make fuzz-long``) runs that many, with a fresh random seed
each run; a failure prints its ``@reproduce_failure`` blob and the minimal program, and
``--hypothesis-seed=N`` repeats a run. Every failure found becomes a ``test_regression_*`` in
``tests/test_fuzz_regressions.py``.

The generator, the oracle and the structural checks live in ``tests/fuzz/``; this file holds the
property test and the tests of the oracle itself.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import event, given, settings
from torch import fx, nn

import fxmobile
from fxmobile.capture import trace as capture_trace
from fxmobile.capture.hooks import TRACED, without_hooks
from fxmobile.report.records import HookRecord, PassRecord, Status
from fxmobile.report.records import Stage as RecordStage
from fxmobile.script.fuse_clamp import FuseClamp
from tests.fuzz.build import build
from tests.fuzz.check import FUZZ, STAGES, Stage, check_model, report_coverage
from tests.fuzz.draw import model_specs
from tests.fuzz.dynamic import BRANCH_CONDITIONS, RANDOM_CALLS
from tests.fuzz.findings import OpenFinding, open_finding
from tests.fuzz.hooks import HOOKS, hook_calls
from tests.fuzz.layers import PARAMETRIZATIONS, SUBCLASS_EXTRAS
from tests.fuzz.oracle import RoundingJitter, assert_close_to_anchor, leaves, results, run
from tests.fuzz.outputs import OUTPUT_TYPES
from tests.fuzz.probes import PROBES
from tests.fuzz.programs import batch_statistics_after_a_bn_chain
from tests.fuzz.script_structure import check_script_structure
from tests.fuzz.spec import Block, HookSpec, Kind, Layout, ModelSpec, Value
from tests.fuzz.structure import check_hook_report, check_structure, needed_batch_stats
from tests.fuzz.untouched import Untouched
from tests.fuzz.views import COPIES, VIEWS, WRITES
from tests.test_no_mutation import ModelSnapshot, assert_outputs_identical


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@FUZZ
@given(spec=model_specs())
def test_optimized_model_matches_eager(stage: Stage, spec: ModelSpec) -> None:
    report_coverage(spec)
    refusal = check_model(stage, spec)
    if refusal:
        event(f"refused: {refusal}")


# ----------------------------------------------------------------------------- the oracle itself


def test_bound_tells_rounding_from_a_bug() -> None:
    """A BN folded with its bias dropped fails the bound; eager's own rounding passes it."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, 6)
    conv, bn = nn.Conv2d(4, 5, 3, bias=False), nn.BatchNorm2d(5)
    model = nn.Sequential(conv, bn).eval()
    mean, var = torch.randn(5), torch.rand(5) + 0.5
    bn.running_mean, bn.running_var = mean.clone(), var.clone()
    with torch.no_grad():
        ref64 = copy.deepcopy(model).double()(x.double())
        eager = model(x)
        noise = float((eager.double() - ref64).abs().max())
        assert_close_to_anchor(eager, ref64, noise, torch.float32, "eager")
        s = bn.weight / torch.sqrt(var + bn.eps)
        folded = copy.deepcopy(conv)
        folded.weight.mul_(s.reshape(-1, 1, 1, 1))
        lost_bias = folded(x)  # W' folded, b' = beta - mean * s forgotten (pytorch#127227)
    with pytest.raises(AssertionError, match="exceeds"):
        assert_close_to_anchor(lost_bias, ref64, noise, torch.float32, "lost bias")


def test_rounding_jitter_moves_results_and_leaves_the_model_alone() -> None:
    """The jittered run differs from eager in the last bits only, never touches parameters,
    moves results written in place, and leaves views and no-op copies alone."""
    spec = batch_statistics_after_a_bn_chain()
    model = build(spec)
    snapshot = ModelSnapshot.take(model)
    eager = results(model, spec)
    with RoundingJitter(spec.seed):
        jittered = results(model, spec)
    snapshot.assert_unchanged(model)
    for e, j in zip(eager[:-1], jittered[:-1], strict=True):
        assert not torch.equal(e, j)
        torch.testing.assert_close(j, e, rtol=0, atol=1e-3 * float(e.abs().max()))
    x = torch.ones(3)
    with RoundingJitter(0):
        y = x.add_(1)
        v = x.view(3)
        c = x.contiguous()
        z = v * 1
    assert y is x and not torch.equal(x, torch.full((3,), 2.0)), "an in-place result stayed"
    moved = x.clone()
    assert torch.equal(v, moved) and torch.equal(c, moved), "a view or no-op copy moved"
    assert not torch.equal(z, moved), "a fresh result was not moved"


def test_structure_checks_see_what_did_not_happen() -> None:
    """Given the unoptimized graph and a report claiming the passes ran, every structural check
    fires: a BN after a conv it alone reads, a dropout module, ``conv(x) * 2``."""
    f32 = torch.float32
    x, y = Value(2, (4, 4), f32), Value(3, (4, 4), f32)
    conv = {"out_channels": 3, "kernel": (3, 3), "stride": (1, 1), "padding": (1, 1)}
    conv |= {"dilation": (1, 1), "groups": 1, "bias": False, "padding_mode": "zeros"}
    bn = {"eps": 1e-5, "affine": True, "track_running_stats": True}
    dropout = {"fn": "Dropout", "p": 0.5, "inplace": False}
    cases = {
        "fold_batchnorm": (Block(Kind.BATCHNORM, "module", 1, y, bn), "must have folded"),
        "decompose_batchnorm": (Block(Kind.BATCHNORM, "module", 1, y, bn), "BN calls left"),
        "remove_dropout": (Block(Kind.DROPOUT, "module", 1, y, dropout), "dropout module"),
        "fold_conv_arithmetic": (
            Block(Kind.ARITHMETIC, "operator", 1, y, {"op": "mul", "const": "scalar", "value": 2}),
            "not folded",
        ),
    }
    for name, (block, message) in cases.items():
        blocks = (Block(Kind.CONV, "module", 0, y, conv), block)
        spec = ModelSpec(x, 1, Layout.CONTIGUOUS, blocks, (2,), 0)
        model = build(spec)
        gm = fx.symbolic_trace(model)
        report = fxmobile.Report("FuzzModel", [PassRecord(name, RecordStage.FX, Status.RAN)])
        with pytest.raises(AssertionError, match=message):
            check_structure(spec, model, gm, report)

    # a conv called twice, rewritten in place (pytorch/pytorch#104593)
    same = {**conv, "out_channels": 2}
    blocks = (
        Block(Kind.CONV, "module", 0, x, same),
        Block(Kind.CONV, "module", 1, x, same, owner=0),
    )
    spec = ModelSpec(x, 1, Layout.CONTIGUOUS, blocks, (2,), 0)
    model = build(spec)
    gm = fx.symbolic_trace(copy.deepcopy(model))
    with torch.no_grad():
        gm.get_parameter("b0.weight").mul_(2)
    with pytest.raises(AssertionError, match="rewritten in place"):
        check_structure(spec, model, gm, fxmobile.Report("FuzzModel"))


def _repeated_batch_statistics(between: Block | None, after: Block | None) -> ModelSpec:
    """One BN on batch statistics called twice on the input, ``between`` the two calls and
    ``after`` them (the long profile's seed-2035 model had a conv scaling its output in place
    after: a write that cannot touch the BN's input)."""
    f32 = torch.float32
    x, y = Value(2, (4, 4), f32), Value(2, (4, 4), f32)
    bn = {"eps": 0.1, "affine": False, "track_running_stats": False}
    blocks = [Block(Kind.BATCHNORM, "module", 0, y, bn)]
    blocks += [between] if between else []
    blocks.append(Block(Kind.BATCHNORM, "module", 0, y, bn, owner=0))
    blocks += [after] if after else []
    outputs = tuple(range(1, len(blocks) + 1))
    return ModelSpec(x, 1, Layout.CONTIGUOUS, tuple(blocks), outputs, 0)


def test_a_repeated_batchnorm_counts_once_unless_a_write_comes_between() -> None:
    f32 = torch.float32
    y = Value(2, (4, 4), f32)
    relu = Block(Kind.ACTIVATION, "module", 1, y, {"op": "relu", "inplace": False})
    written = Block(Kind.ACTIVATION, "module", 0, y, {"op": "relu", "inplace": True})
    conv = {"out_channels": 2, "kernel": (1, 1), "stride": (1, 1), "padding": (0, 0)}
    conv |= {"dilation": (1, 1), "groups": 1, "bias": False, "padding_mode": "zeros"}
    scaled = Block(Kind.CONV, "module", 1, y, {**conv, "hooks": (HookSpec("scale_in_place", 0.5),)})
    assert needed_batch_stats(_repeated_batch_statistics(relu, None)) == 1
    assert needed_batch_stats(_repeated_batch_statistics(relu, scaled)) == 1
    assert needed_batch_stats(_repeated_batch_statistics(written, None)) == 2
    assert needed_batch_stats(_repeated_batch_statistics(scaled, None)) == 2


def _conv_bn_relu_dropout(dims: int) -> ModelSpec:
    """conv -> BN (running statistics) -> relu -> dropout, on a ``dims``-D input."""
    f32 = torch.float32
    x, y = Value(2, (5,) * dims, f32), Value(3, (5,) * dims, f32)
    conv = {"out_channels": 3, "kernel": (1,) * dims, "stride": (1,) * dims}
    conv |= {"padding": (0,) * dims, "dilation": (1,) * dims, "groups": 1, "bias": True}
    conv |= {"padding_mode": "zeros"}
    blocks = (
        Block(Kind.CONV, "module", 0, y, conv),
        Block(Kind.BATCHNORM, "module", 1, y, {"eps": 1e-5, "affine": True,
                                               "track_running_stats": True}),
        Block(Kind.ACTIVATION, "module", 2, y, {"op": "relu", "inplace": False}),
        Block(Kind.DROPOUT, "module", 3, y, {"fn": "Dropout", "p": 0.5, "inplace": False}),
    )  # fmt: skip
    return ModelSpec(x, 1, Layout.CONTIGUOUS, blocks, (4,), 0)


@pytest.mark.parametrize(
    "dims, blocked, message",
    [
        (2, {"CONV_BN_FUSION", "DECOMPOSE_BATCHNORM"}, "BatchNorm calls on running statistics"),
        (2, {"REMOVE_DROPOUT"}, "dropout left"),
        (2, {"INSERT_FOLD_PREPACK_OPS"}, "left unpacked"),
        (1, {"CONV_1D_TO_2D"}, "aten::conv1d left"),
        (2, set(), "clamps not fused"),
    ],
    ids=["batchnorm", "dropout", "prepack", "conv1d", "clamp"],
)
def test_script_structure_checks_see_what_did_not_happen(
    dims: int, blocked: set[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the pass that keeps each promise switched off (or, for clamp fusion, made to fuse
    nothing), the CPU module's structural check fires."""
    if not blocked:
        monkeypatch.setattr(FuseClamp, "_fuse", staticmethod(lambda graph, run, slots: ""))
    spec = _conv_bn_relu_dropout(dims)
    model = build(spec)
    blocklist = {fxmobile.MobileOptimizerType[name] for name in blocked}
    module = fxmobile.optimize(model, blocklist, example_inputs=run(model, spec)[1]).module
    with pytest.raises(AssertionError, match=message):
        check_script_structure(spec, module, 0, 0)


def test_generated_models_are_valid_and_traceable() -> None:
    """The generator's promise, checked apart from fxmobile: eager runs, the same on a second
    call; plain torch.fx traces the model where it can (no hook outside a leaf call, no
    subclassed layer or cache, no item assignment), and it pickles where torch can (no hooks,
    no parametrizations)."""

    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    @given(spec=model_specs())
    def check(spec: ModelSpec) -> None:
        model = build(spec)
        out, _ = run(model, spec)
        for t, v in zip(leaves(out), [spec.values()[k] for k in spec.outputs], strict=True):
            assert tuple(t.shape) == v.shape(spec.batch), spec
            assert t.dtype == v.dtype, spec
        assert_outputs_identical(leaves(out), leaves(run(model, spec)[0]))
        blocks = spec.blocks
        dynamic = (Kind.CACHE, Kind.BRANCH, Kind.RANDOM, Kind.COUNTER)  # state, branches, draws
        if not spec.root_hooks and not any(
            b.options.get("subclass") or b.kind in dynamic or b.options.get("write") == "setitem"
            for b in blocks
        ):
            gm = fx.symbolic_trace(copy.deepcopy(model))
            assert_outputs_identical(leaves(out), leaves(run(gm, spec)[0]))
        if not spec.root_hooks and not any(b.hooks or b.options.get("parametrize") for b in blocks):
            unpickled = pickle.loads(pickle.dumps(model))
            assert_outputs_identical(leaves(out), leaves(run(unpickled, spec)[0]))

    check()


def test_generator_draws_every_idiom() -> None:
    """Over 3,000 draws (drawing is cheap: no model is built or checked), every idiom shows
    up: each hook, parametrization, subclass, view op (in one spelling or another), write,
    copy, cache pattern and output container; each block kind, branch, random call, dtype and
    check-time probe, and an optional input left at None."""
    seen: set[str] = set()

    @settings(max_examples=3000, derandomize=True, database=None, deadline=None)
    @given(spec=model_specs())
    def collect(spec: ModelSpec) -> None:
        seen.add(f"output {spec.output_type}")
        seen.update(f"hook {h.name}" for h in spec.root_hooks)
        for b in spec.blocks:
            seen.update(f"hook {h.name}" for h in b.hooks)
            seen.update(f"parametrize {p}" for p in b.options.get("parametrize", ()))
            if b.options.get("subclass"):
                seen.add(f"subclass {b.options['subclass']}")
            if b.kind is Kind.VIEW_WRITE:
                seen.update(f"view {VIEWS[name].family}" for name, _ in b.options["views"])
                seen.add(f"write {b.options['write']}")
                seen.add(f"copy {b.options['copy']}")
            if b.kind is Kind.CACHE:
                seen.add(f"cache {b.options['pattern']}")
            if b.kind is Kind.BRANCH:
                seen.add(f"branch {b.options['on']} {b.form}")
            if b.kind is Kind.RANDOM:
                seen.add(f"random {b.options['call']}")
            seen.add(f"kind {b.kind.value}")
        seen.add(f"dtype {spec.input.dtype}")
        seen.add(f"probe {spec.probe}")
        if spec.optional_input:
            seen.add("optional input")

    collect()
    wanted = {f"output {t}" for t in OUTPUT_TYPES} | {f"hook {h}" for h in HOOKS}
    wanted |= {f"parametrize {p}" for p in PARAMETRIZATIONS}
    wanted |= {f"subclass {e}" for e in SUBCLASS_EXTRAS} | {
        f"view {v.family}" for v in VIEWS.values()
    }
    wanted |= {f"write {w}" for w in WRITES} | {f"copy {c}" for c in (None, *COPIES)}
    wanted |= {"cache dict", "cache levit", "optional input"}
    wanted |= {f"branch {on} {form}" for on in BRANCH_CONDITIONS for form in ("module", "inline")}
    wanted |= {f"random {call}" for call in RANDOM_CALLS} | {f"kind {k.value}" for k in Kind}
    wanted |= {f"dtype {t}" for t in (torch.float32, torch.float64, torch.float16, torch.bfloat16)}
    wanted |= {f"probe {p}" for p in (None, *PROBES)}
    assert wanted <= seen, f"never drawn: {sorted(wanted - seen)}"


def _hooked_conv_bn(hooks: tuple[HookSpec, ...], **model: Any) -> ModelSpec:
    """conv (with ``hooks``) -> BN, on a 2-D input; ``model``: ModelSpec's idiom fields."""
    f32 = torch.float32
    x, y = Value(2, (4, 4), f32), Value(3, (4, 4), f32)
    conv = {"out_channels": 3, "kernel": (1, 1), "stride": (1, 1), "padding": (0, 0)}
    conv |= {"dilation": (1, 1), "groups": 1, "bias": True, "padding_mode": "zeros"}
    bn = {"eps": 1e-5, "affine": True, "track_running_stats": True}
    blocks = (
        Block(Kind.CONV, "module", 0, y, {**conv, "hooks": hooks}),
        Block(Kind.BATCHNORM, "module", 1, y, bn),
    )
    return ModelSpec(x, 1, Layout.CONTIGUOUS, blocks, (2,), 0, **model)


def test_hook_checks_see_a_hook_dropped_or_misreported() -> None:
    """A graph that calls the hooked conv without its recorder fails the structure check and
    sees other hook calls than eager; a report that calls the recorder traced fails too."""
    spec = _hooked_conv_bn((HookSpec("recorder"),))
    model = build(spec)
    gm = fx.GraphModule(model, fx.Tracer().trace(model))  # calls the model's own modules
    check_structure(spec, model, gm, fxmobile.Report("FuzzModel"))
    eager_calls = hook_calls(model, lambda: run(model, spec))
    assert eager_calls == ([[("forward", (1, 3, 4, 4), torch.float32)]], 0)
    assert hook_calls(model, lambda: run(gm, spec)) == eager_calls
    gm.add_submodule("b0", without_hooks(model.get_submodule("b0")))
    with pytest.raises(AssertionError, match="calls of modules with hooks"):
        check_structure(spec, model, gm, fxmobile.Report("FuzzModel"))
    assert hook_calls(model, lambda: run(gm, spec)) != eager_calls
    report = fxmobile.Report("FuzzModel")
    report.hooks = [HookRecord("b0", "forward hook", "Recorder", TRACED)]
    with pytest.raises(AssertionError, match="the hook rule"):
        check_hook_report(model, report)


def test_untouched_sees_hooks_and_caches_change() -> None:
    spec = _hooked_conv_bn((HookSpec("scale", 2.0),))
    model = build(spec)
    untouched = Untouched.take(model)
    untouched.assert_unchanged(model)
    model.get_submodule("b0")._forward_hooks.clear()
    with pytest.raises(AssertionError, match="hooks changed"):
        untouched.assert_unchanged(model)
    cached = ModelSpec(
        spec.input, 1, Layout.CONTIGUOUS,
        (Block(Kind.CACHE, "module", 0, spec.input, {"pattern": "dict", "op": "mul"}),), (1,), 0,
    )  # fmt: skip
    model = build(cached)
    untouched = Untouched.take(model)
    run(model, cached)  # fills the cache
    with pytest.raises(AssertionError, match="caches changed"):
        untouched.assert_unchanged(model)


def test_refusals_are_failures_unless_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal of a model the docs say fxmobile optimizes fails; so does optimizing a
    model the docs say it refuses (torch's global module hooks)."""
    spec = _hooked_conv_bn((), global_hook="forward")
    assert check_model(Stage.FX, spec) == "torch's global module hooks"
    monkeypatch.setattr(capture_trace, "refuse_global_hooks", lambda: None)
    with pytest.raises(AssertionError, match="the docs document refusing this model"):
        check_model(Stage.FX, spec)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise fxmobile.CaptureError("no reason")

    monkeypatch.setattr(fxmobile, "optimize_fx", refuse)
    with pytest.raises(AssertionError, match="do not document refusing: CaptureError"):
        check_model(Stage.FX, _hooked_conv_bn(()))


def test_open_findings_match_their_own_failure_only() -> None:
    """An open finding excuses a failure only on its stage, for a program with its idiom, and
    with its words (here a made-up finding: item assignment refused, as F2 once was)."""
    x = Value(2, (3,), torch.float32)
    write = {"copy": "add0", "views": (("select", (1, 0)),), "write": "setitem", "value": 0.5}
    spec = ModelSpec(x, 1, Layout.CONTIGUOUS, (Block(Kind.VIEW_WRITE, "method", 0, x, write),),
                     (1,), 0)  # fmt: skip
    finding = OpenFinding(
        "F0",
        ("fx",),
        lambda s: any(b.options.get("write") == "setitem" for b in s.blocks),
        r"^AssertionError: fxmobile refused .*does not support item assignment",
    )
    failure = AssertionError(
        "fxmobile refused a model the docs do not document refusing: CaptureError: "
        "torch.fx could not trace FuzzModel.forward at views.py:1: v[...] = c: TypeError: "
        "'Proxy' object does not support item assignment. Fix: ..."
    )
    assert finding.matches("fx", spec, failure)
    assert not finding.matches("script-cpu", spec, failure)
    assert not finding.matches("fx", spec, AssertionError("output 0: max abs error 1 exceeds"))
    other = replace(spec, blocks=(replace(spec.blocks[0], options={**write, "write": "add_"}),))
    assert not finding.matches("fx", other, failure)
    assert open_finding("fx", spec, AssertionError("output 0: max abs error 1 exceeds")) is None
