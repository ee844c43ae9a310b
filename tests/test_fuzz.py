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
  with the model;
- or be refused, only where the README documents refusing such a model
  (``tests.fuzz.expect``): any other refusal, crash or exception is a failure. fxmobile's gate
  may fail a correct model only where eager's rounding noise reaches its tolerance.

Profiles: ``make test`` runs 500 models per stage, derandomized (the same models every run).
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

import pytest
import torch
from hypothesis import event, given, settings
from torch import fx, nn

import fxmobile
from fxmobile.report.records import PassRecord, Status
from fxmobile.report.records import Stage as RecordStage
from fxmobile.script.fuse_clamp import FuseClamp
from tests.fuzz.build import build
from tests.fuzz.check import FUZZ, STAGES, Stage, check_model, report_coverage
from tests.fuzz.draw import model_specs
from tests.fuzz.oracle import RoundingJitter, assert_close_to_anchor, leaves, results, run
from tests.fuzz.programs import batch_statistics_after_a_bn_chain
from tests.fuzz.script_structure import check_script_structure
from tests.fuzz.spec import Block, Kind, Layout, ModelSpec, Value
from tests.fuzz.structure import check_structure
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
    """The generator's promise, checked apart from fxmobile: eager runs, fx traces the model."""

    @settings(max_examples=50, derandomize=True, database=None, deadline=None)
    @given(spec=model_specs())
    def check(spec: ModelSpec) -> None:
        model = build(spec)
        out, _ = run(model, spec)
        for t, v in zip(leaves(out), [spec.values()[k] for k in spec.outputs], strict=True):
            assert tuple(t.shape) == v.shape(spec.batch), spec
            assert t.dtype == v.dtype, spec
        gm = fx.symbolic_trace(copy.deepcopy(model))
        assert_outputs_identical(out, run(gm, spec)[0])
        assert_outputs_identical(out, run(pickle.loads(pickle.dumps(model)), spec)[0])

    check()
