"""Benchmark: fxmobile's output against the other ways to run a torchvision model on a CPU.

Why: fxmobile is worth using only if its file is at least as fast as what a user would
otherwise ship. For each model (random weights, BatchNorm statistics randomized, eval, batch 1,
1x3x224x224, 2 threads) the candidates are built one after another, each is checked against
eager on the same input, and then all of them are timed interleaved in one
``fxmobile.runtime.compare_latency`` call: every round runs each candidate once, in a fresh
random order, wherever it lives (this process, or a child process that stays up for the whole
run and times its own calls), over many rounds; per candidate the median and the 10th percentile.

Each candidate names the runtime it ran on and the kernels (``RUNS_ON``/``KERNELS`` below,
printed in a legend with every table):

- ``eager``, ``eager_cl`` (model and input channels-last): torch 2.15 here, ATen;
- ``jit_ofi``: ``torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.script(m)))``;
- ``compile``: ``torch.compile(m)`` (inductor); its compile time is the first call;
- ``ort``: ONNX Runtime on the CPU (only when ``onnxruntime`` imports), graph optimizations ALL;
- ``fxm``: ``fxmobile.optimize(m, example_inputs=x)`` as TorchScript here; ``fxm_lite``: its
  saved file in this process's lite interpreter (fxmobile's kernels, ``fxmobile._C``);
  ``fxm_nchw``: ``optimize(..., channels_last=False)``, eager's layout kept;
- ``fxm_212``: the same saved file in the real torch 2.12.1 runtime, on its XNNPACK kernels;
  ``ofm_212``: upstream's ``optimize_for_mobile`` file, made in torch 2.12.1 from the same
  weights (the model scripted here), in that runtime (both need ``make runtimes``);
- ``et``: ExecuTorch 1.5.1, ``torch.export`` + ``to_edge_transform_and_lower`` with the
  XNNPACK partitioner, in its own venv and process (``make peers``; ``executorch_peer.py``).

A candidate whose runtime is not installed is left out with a line saying so. The table gives
median ms [10th percentile] and the speedup over eager; a ``!`` marks a candidate whose output
is off eager by more than ``--tolerance`` (max abs error relative to the largest eager output
magnitude), so a fast wrong answer shows. GFLOP/s counts the eager model's FLOPs once
(``FlopCounterMode``). A candidate that fails to build or run is recorded with its error and
the run goes on. Compare ratios within a model; absolute figures move with load (the load
average is printed and written to the JSON).

Run from the repository root: ``python benchmarks/bench_peers.py [--models ...] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# OpenMP threads wait passively unless the environment says otherwise: spinning assumes free
# cores, and on this shared 2-core machine it made 2-thread medians swing 2-10x (mobilenet_v3
# eager at 2 threads slower than at 1). Set before torch loads the OpenMP runtime; it applies
# to every candidate alike (the runtimes' child processes inherit it; ONNX Runtime keeps its own
# thread pool's defaults).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.jit.mobile
import torchvision
from tabulate import tabulate
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import fxmobile
from fxmobile.runtime import LoadedFile, RuntimeProcess, installed
from fxmobile.runtime.errors import RuntimeNotInstalledError
from fxmobile.runtime.latency import Candidate as Timer
from fxmobile.runtime.latency import Here, Latency, OnRuntime, compare_latency
from fxmobile.runtime.process import require_peer
from fxmobile.verify import compare_outputs, randomize_batchnorm_statistics

MODELS = (
    "resnet18",
    "resnet50",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "shufflenet_v2_x1_0",
    "squeezenet1_1",
    "regnet_y_400mf",
    "mnasnet1_0",
    "convnext_tiny",
)
# The models a phone runs: the summary's median speedup over eager is taken over these.
MOBILE_MODELS = frozenset(
    {
        "mobilenet_v2",
        "mobilenet_v3_large",
        "mobilenet_v3_small",
        "efficientnet_b0",
        "shufflenet_v2_x1_0",
        "mnasnet1_0",
        "regnet_y_400mf",
    }
)
INPUT_SHAPE = (1, 3, 224, 224)
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "bench_peers.json"
REFERENCE_RUNTIME = "2.12.1"  # the real runtime built with XNNPACK
EXECUTORCH = "executorch-1.5.1"  # fxmobile.runtime.install.PEERS
EXECUTORCH_SCRIPT = Path(__file__).resolve().with_name("executorch_peer.py")
HERE = f"torch {torch.__version__.split('+')[0]}, this process"


@dataclass
class Built:
    """A ready-to-time candidate: ``run`` returns its output (for the check against eager),
    ``timer`` times it where it lives; ``close`` frees what it holds in a child process."""

    run: Callable[[], Any]
    timer: Timer
    setup_s: float  # building it: scripting, compiling, exporting, optimizing, lowering
    as_tensor: Callable[[Any], Any] = lambda out: out
    extra: dict[str, Any] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None


@dataclass
class Ctx:
    """What every builder gets: the model and its name, its input, a scratch folder, the
    running child processes, and what earlier builders kept for later ones."""

    name: str
    model: nn.Module
    x: torch.Tensor
    workdir: Path
    processes: dict[str, RuntimeProcess]
    keep: dict[str, Any]


@dataclass(frozen=True)
class Candidate:
    """One column of the benchmark: ``name`` is its key (``--skip``, the JSON), ``label`` its
    header, ``build`` makes it for a model, ``runs_on`` and ``kernels`` say where it ran in the
    legend, ``needs`` the child process it needs, if any."""

    name: str
    label: str  # column header
    build: Callable[[Ctx], Built]
    runs_on: str
    kernels: str
    needs: str | None = None  # the child process it runs in (REFERENCE_RUNTIME, EXECUTORCH)


@dataclass
class Outcome:
    """One candidate on one model: its latency (ms, with where it ran), setup seconds, relative
    error against eager and builder extras; ``error`` when it failed to build, run or be timed,
    and then ``timing`` is None."""

    timing: Latency | None = None
    setup_s: float | None = None
    relative_error: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


Results = dict[str, tuple[int, dict[str, Outcome]]]  # model -> (FLOPs, outcome per candidate)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silences torch's deprecation warnings and the ONNX exporter's progress lines."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r".*Lite Interpreter is deprecated")
        warnings.filterwarnings("ignore", category=UserWarning)
        yield


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    with _quiet():
        value = fn()
    return value, time.perf_counter() - start


def _here(run: Callable[[], Any], kernels: str, runs_on: str = HERE) -> Timer:
    timer = Here(run, (), kernels)
    timer.runs_on = runs_on
    return timer


def build_eager(ctx: Ctx) -> Built:
    """The reference: the model as built, in this process (torch 2.15, ATen); no setup."""
    model, x = ctx.model, ctx.x
    run = lambda: model(x)  # noqa: E731
    return Built(run, _here(run, KERNELS["eager"]), 0.0)


def build_eager_cl(ctx: Ctx) -> Built:
    """Eager on a channels-last copy of the model and input (torch 2.15, ATen); no setup."""
    cl = torch.channels_last
    model = copy.deepcopy(ctx.model).to(memory_format=cl)
    x = ctx.x.contiguous(memory_format=cl)
    run = lambda: model(x)  # noqa: E731
    return Built(run, _here(run, KERNELS["eager_cl"]), 0.0)


def build_jit_ofi(ctx: Ctx) -> Built:
    """``optimize_for_inference(freeze(script(copy)))`` in this process (TorchScript on ATen and
    oneDNN); setup is the scripting, freezing and optimizing."""

    def make() -> torch.jit.ScriptModule:
        frozen = torch.jit.freeze(torch.jit.script(copy.deepcopy(ctx.model)))
        return torch.jit.optimize_for_inference(frozen)

    module, seconds = _timed(make)
    x = ctx.x
    run = lambda: module(x)  # noqa: E731
    return Built(run, _here(run, KERNELS["jit_ofi"]), seconds)


def build_compile(ctx: Ctx) -> Built:
    """``torch.compile`` of a copy (inductor), compiled by a first call under ``no_grad``; that
    call's seconds are its setup and ``extra["compile_s"]``. Unless ``--warm-compile-cache``,
    inductor's cache is fresh for the run, so this is a first compile's cost."""
    compiled = torch.compile(copy.deepcopy(ctx.model))
    x = ctx.x
    with torch.no_grad():  # grad mode is a guard: compile for the mode the timing runs in
        _, seconds = _timed(lambda: compiled(x))
    run = lambda: compiled(x)  # noqa: E731
    return Built(run, _here(run, KERNELS["compile"]), seconds, extra={"compile_s": seconds})


def _onnx_bytes(model: nn.Module, x: torch.Tensor) -> tuple[bytes, str]:
    """The model as ONNX, and which exporter made it: the dynamo one (needs onnxscript), else
    the TorchScript-based one, which torch 2.15 still ships behind ``dynamo=False``."""
    try:
        program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
        if program is None:
            raise RuntimeError("torch.onnx.export(dynamo=True) returned no ONNXProgram")
        return program.model_proto.SerializeToString(), "dynamo"
    except Exception as dynamo_error:
        buffer = io.BytesIO()
        try:
            # torch types ``f`` as a path, but the TorchScript exporter writes to a file-like
            # object too (torch.onnx's own call into it carries the same ignore)
            torch.onnx.export(model, (x,), buffer, dynamo=False)  # type: ignore[arg-type]
        except Exception as legacy_error:
            raise RuntimeError(
                f"dynamo exporter: {_first_line(dynamo_error)}; "
                f"dynamo=False: {_first_line(legacy_error)}"
            ) from legacy_error
        return buffer.getvalue(), "torchscript"


def build_ort(ctx: Ctx) -> Built:
    """The model exported to ONNX and run by ONNX Runtime in this process on its CPU execution
    provider: all graph optimizations, as many intra-op threads as torch has, one inter-op.

    Setup is export plus session creation (both also in ``extra``, with whether the dynamo
    exporter made the file); the first output is the one checked against eager.
    """
    import onnxruntime as ort

    (proto, exporter), export_s = _timed(lambda: _onnx_bytes(copy.deepcopy(ctx.model), ctx.x))
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    start = time.perf_counter()
    session = ort.InferenceSession(proto, options, providers=["CPUExecutionProvider"])
    session_s = time.perf_counter() - start
    feed = {session.get_inputs()[0].name: ctx.x.numpy()}
    run = lambda: session.run(None, feed)  # noqa: E731
    return Built(
        run,
        _here(run, KERNELS["ort"], f"ONNX Runtime {ort.__version__}, this process"),
        export_s + session_s,
        as_tensor=lambda outs: torch.from_numpy(outs[0]),
        extra={
            "export_s": export_s,
            "session_s": session_s,
            "dynamo_exporter": exporter == "dynamo",
        },
    )


def _fxmobile(ctx: Ctx, key: str, **options: Any) -> fxmobile.MobileResult:
    """``fxmobile.optimize`` of the model (once per ``key``; later builders reuse it)."""
    if key not in ctx.keep:
        result, seconds = _timed(
            lambda: fxmobile.optimize(ctx.model, example_inputs=ctx.x, **options)
        )
        ctx.keep[key] = result
        ctx.keep[f"{key}_s"] = seconds
    return ctx.keep[key]


def _fxm_file(ctx: Ctx) -> tuple[Path, float]:
    """The saved fxmobile file (what an app ships), and the seconds optimizing took."""
    path = ctx.workdir / "fxm.ptl"
    if not path.exists():
        _fxmobile(ctx, "fxm").save(path)
    return path, ctx.keep["fxm_s"]


def build_fxm(ctx: Ctx) -> Built:
    """The defaults: on the CPU backend, activations run channels-last."""
    result = _fxmobile(ctx, "fxm")
    module, x = result.module, ctx.x
    run = lambda: module(x)  # noqa: E731
    extra = {"optimize_s": ctx.keep["fxm_s"], "check_passed": result.report.numerics_passed}
    return Built(run, _here(run, KERNELS["fxm"]), ctx.keep["fxm_s"], extra=extra)


def build_fxm_nchw(ctx: Ctx) -> Built:
    """``channels_last=False``: eager's layout kept, to show what the layout is worth."""
    module, x = _fxmobile(ctx, "fxm_nchw", channels_last=False).module, ctx.x
    run = lambda: module(x)  # noqa: E731
    return Built(run, _here(run, KERNELS["fxm_nchw"]), ctx.keep["fxm_nchw_s"])


def build_fxm_lite(ctx: Ctx) -> Built:
    """fxmobile's saved file in this process's lite interpreter (fxmobile._C's kernels); setup
    is optimizing plus loading the file."""
    path, optimize_s = _fxm_file(ctx)
    module, load_s = _timed(lambda: torch.jit.mobile._load_for_lite_interpreter(str(path)))
    x = ctx.x
    run = lambda: module(x)  # noqa: E731
    return Built(run, _here(run, KERNELS["fxm_lite"]), optimize_s + load_s)


def _on_runtime(loaded: LoadedFile, x: torch.Tensor, name: str, setup_s: float) -> Built:
    timer = OnRuntime(loaded, (x,))
    timer.runs_on, timer.kernels = RUNS_ON[name], KERNELS[name]
    return Built(lambda: loaded.run(x), timer, setup_s, close=loaded.close)


def build_fxm_212(ctx: Ctx) -> Built:
    """The same saved file loaded in the torch 2.12.1 child and timed there, on its XNNPACK
    kernels; setup is the optimizing only (the load in the child is not counted)."""
    path, optimize_s = _fxm_file(ctx)
    loaded = ctx.processes[REFERENCE_RUNTIME].load(path)
    return _on_runtime(loaded, ctx.x, "fxm_212", optimize_s)


def build_ofm_212(ctx: Ctx) -> Built:
    """Upstream's optimize_for_mobile, run in torch 2.12.1 on the model scripted here."""
    path = ctx.workdir / "scripted.pt"
    _, script_s = _timed(lambda: torch.jit.save(torch.jit.script(copy.deepcopy(ctx.model)), path))
    start = time.perf_counter()
    loaded = ctx.processes[REFERENCE_RUNTIME].upstream_optimized(path)
    return _on_runtime(loaded, ctx.x, "ofm_212", script_s + time.perf_counter() - start)


def build_et(ctx: Ctx) -> Built:
    """ExecuTorch's XNNPACK flow on the same weights, in its own venv (executorch_peer.py)."""
    weights = ctx.workdir / "weights.pt"
    torch.save(ctx.model.state_dict(), weights)
    process = ctx.processes[EXECUTORCH]
    reply = process.call(
        "lower_torchvision",
        name=ctx.name,
        weights=str(weights),
        shape=list(ctx.x.shape),
        output=str(ctx.workdir / "model.pte"),
    )
    loaded = LoadedFile(process, reply["handle"], f"{ctx.name}.pte", "executorch")
    built = _on_runtime(loaded, ctx.x, "et", reply["lower_s"])
    built.extra = {k: reply[k] for k in ("pte_bytes", "delegate_calls", "ops_outside_delegate")}
    return built


CANDIDATES = (
    Candidate("eager", "eager", build_eager, HERE, "ATen"),
    Candidate("eager_cl", "eager CL", build_eager_cl, HERE, "ATen, channels-last"),
    Candidate("jit_ofi", "jit freeze+ofi", build_jit_ofi, HERE, "TorchScript, ATen/oneDNN"),
    Candidate("compile", "compile", build_compile, HERE, "inductor C++ + ATen"),
    Candidate("ort", "ORT", build_ort, "ONNX Runtime, this process", "ORT CPU EP (MLAS)"),
    Candidate("fxm", "fxm", build_fxm, HERE, "TorchScript, fxmobile._C"),
    Candidate("fxm_lite", "fxm file here", build_fxm_lite, HERE, "lite interpreter, fxmobile._C"),
    Candidate("fxm_nchw", "fxm NCHW", build_fxm_nchw, HERE, "TorchScript, fxmobile._C, NCHW"),
    Candidate(
        "fxm_212",
        "fxm file on 2.12.1",
        build_fxm_212,
        "torch 2.12.1 lite interpreter (reference runtime)",
        "XNNPACK",
        needs=REFERENCE_RUNTIME,
    ),
    Candidate(
        "ofm_212",
        "upstream file on 2.12.1",
        build_ofm_212,
        "torch 2.12.1 lite interpreter (reference runtime)",
        "XNNPACK",
        needs=REFERENCE_RUNTIME,
    ),
    Candidate(
        "et",
        "ExecuTorch",
        build_et,
        "ExecuTorch 1.5.1 runtime (its venv, torch 2.14.1)",
        "XNNPACK delegate",
        needs=EXECUTORCH,
    ),
)
NAMES = tuple(c.name for c in CANDIDATES)
RUNS_ON = {c.name: c.runs_on for c in CANDIDATES}
KERNELS = {c.name: c.kernels for c in CANDIDATES}


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 300 else text[:297] + "..."


def build_model(name: str) -> nn.Module:
    """torchvision's ``name`` with random weights (from torch's global generator: the caller
    seeds it), BatchNorm statistics randomized at ``INPUT_SHAPE``, in eval mode."""
    model = torchvision.models.get_model(name, weights=None)
    return randomize_batchnorm_statistics(model, INPUT_SHAPE)


def count_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one eager forward on ``x`` by ``FlopCounterMode`` (a multiply-add is 2)."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    return int(counter.get_total_flops())


def bench_model(
    name: str,
    candidates: list[Candidate],
    processes: dict[str, RuntimeProcess],
    rounds: int,
    warmup: int,
) -> tuple[int, dict[str, Outcome]]:
    """FLOPs of ``name`` and one ``Outcome`` per candidate, failures included."""
    torch.manual_seed(0)
    model = build_model(name)
    x = torch.randn(INPUT_SHAPE)
    flops = count_flops(model, x)
    with torch.no_grad():
        reference = model(x)
    outcomes: dict[str, Outcome] = {}
    built: dict[str, Built] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Ctx(name, model, x, Path(tmp), processes, {})
        try:
            for cand in candidates:
                outcome = outcomes[cand.name] = Outcome()
                try:
                    made = cand.build(ctx)
                    built[cand.name] = made
                    with torch.no_grad(), _quiet():
                        actual = made.as_tensor(made.run())
                    (check,) = compare_outputs(reference, actual, 1.0)
                except Exception as exc:
                    outcome.error = _first_line(exc)
                    print(f"  {name}: {cand.name} failed: {outcome.error}", file=sys.stderr)
                    built.pop(cand.name, None)
                    continue
                outcome.setup_s, outcome.extra = made.setup_s, made.extra
                outcome.relative_error = check.relative_error
            for cand_name, latency in _time_all(name, built, outcomes, rounds, warmup).items():
                outcomes[cand_name].timing = latency
        finally:
            for made in built.values():
                with contextlib.suppress(Exception):
                    made.close()
    return flops, outcomes


def _time_all(
    model: str,
    built: dict[str, Built],
    outcomes: dict[str, Outcome],
    rounds: int,
    warmup: int,
) -> dict[str, Latency]:
    """``compare_latency`` of every built candidate; one that fails while timed (after a first
    call that worked) gets the error in its outcome, and the others are timed again."""
    timers = {name: made.timer for name, made in built.items()}
    try:
        with _quiet():
            return compare_latency(timers, rounds=rounds, warmup=warmup)
    except Exception as exc:
        print(f"  {model}: timing failed ({_first_line(exc)}); retrying", file=sys.stderr)
    working = {}
    for name, timer in timers.items():
        try:
            with _quiet():
                timer.time(1)
            working[name] = timer
        except Exception as exc:
            outcomes[name].error = f"failed while timed: {_first_line(exc)}"
    with _quiet():
        return compare_latency(working, rounds=rounds, warmup=warmup) if working else {}


def _speedup(outcomes: dict[str, Outcome], name: str) -> float | None:
    base, cand = outcomes.get("eager"), outcomes.get(name)
    if base is None or cand is None or base.timing is None or cand.timing is None:
        return None
    return base.timing.timing.median_ms / cand.timing.timing.median_ms


def legend(cands: list[Candidate]) -> str:
    """Where each column ran and on which kernels."""
    rows = [[c.label, c.runs_on, c.kernels] for c in cands]
    return tabulate(rows, headers=["column", "runs on", "kernels"])


def latency_table(results: Results, cands: list[Candidate], tol: float, fmt: str = "simple") -> str:
    """Median ms [10th percentile] (speedup of the median over eager's) per model and
    candidate; ``!`` where the output is off eager by more than ``tol``."""
    rows = []
    for model, (_flops, outcomes) in results.items():
        row: list[object] = [model]
        for cand in cands:
            out = outcomes[cand.name]
            if out.timing is None:
                row.append("failed" if out.error else "-")
                continue
            timing = out.timing.timing
            cell = (
                f"{timing.median_ms:.2f} [{timing.p10_ms:.2f}] "
                f"(×{_speedup(outcomes, cand.name) or 0:.2f})"
            )
            if out.relative_error is not None and not out.relative_error <= tol:
                cell += " !"
            row.append(cell)
        rows.append(row)
    headers = ["median ms [p10] (×speedup)", *(f"{c.label}: {c.kernels}" for c in cands)]
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def _grid(
    results: Results,
    cands: list[Candidate],
    title: str,
    cell: Callable[[int, Outcome], float | None],
    floatfmt: str,
) -> str:
    rows = [
        [model, *(cell(flops, outcomes[c.name]) for c in cands)]
        for model, (flops, outcomes) in results.items()
    ]
    headers = [title, *(c.label for c in cands)]
    return tabulate(rows, headers=headers, floatfmt=floatfmt, missingval="-")


def _gflops(flops: int, out: Outcome) -> float | None:
    return None if out.timing is None else flops / (out.timing.timing.median_ms * 1e-3) / 1e9


def gflops_table(results: Results, cands: list[Candidate]) -> str:
    """GFLOP/s per model and candidate: the eager model's FLOPs over the candidate's median
    latency (the same count for every candidate, whatever its graph computes)."""
    return _grid(results, cands, "GFLOP/s", _gflops, ".1f")


def error_table(results: Results, cands: list[Candidate]) -> str:
    """Each candidate's relative error against eager per model (max abs error over the largest
    eager output magnitude), from the check made when it was built."""
    return _grid(results, cands, "rel. error vs eager", lambda _f, o: o.relative_error, ".1e")


def setup_table(results: Results, cands: list[Candidate]) -> str:
    """Seconds to build each candidate: scripting, first compiled call, export, optimize."""
    built = [c for c in cands if c.name not in ("eager", "eager_cl")]
    table = _grid(results, built, "setup s", lambda _f, o: o.setup_s, ".2f")
    flops = ", ".join(f"{model} {f / 1e9:.2f}" for model, (f, _o) in results.items())
    return f"{table}\nGFLOP per inference: {flops}"


def _ratio(outcomes: dict[str, Outcome], num: str, den: str) -> float | None:
    a, b = outcomes.get(num), outcomes.get(den)
    if a is None or b is None or a.timing is None or b.timing is None:
        return None
    return b.timing.timing.median_ms / a.timing.timing.median_ms


# (candidate, the one it is compared with): ratios of medians, >1 when the first is faster
PAIRS = (
    ("fxm_212", "ofm_212"),
    ("fxm_lite", "fxm_212"),
    ("fxm_212", "et"),
    ("fxm_212", "ort"),
    ("fxm", "jit_ofi"),
)


def summary(results: Results) -> str:
    """The ``PAIRS`` ratios per model (median of B over median of A: above 1, A is faster),
    then the median speedup over eager across ``MOBILE_MODELS`` of each shipped-file candidate
    and ORT."""
    lines = []
    rows = []
    for model, (_f, outcomes) in results.items():
        rows.append([model, *(_ratio(outcomes, a, b) for a, b in PAIRS)])
    headers = ["median of B / median of A (>1: A faster)", *(f"A={a} B={b}" for a, b in PAIRS)]
    lines.append(tabulate(rows, headers=headers, floatfmt=".2f", missingval="-"))
    for name in ("fxm_lite", "fxm_212", "ofm_212", "et", "ort"):
        speedups = [
            s
            for model, (_f, outcomes) in results.items()
            if model in MOBILE_MODELS and (s := _speedup(outcomes, name)) is not None
        ]
        if speedups:
            lines.append(
                f"median speedup of {name} over eager on {len(speedups)} mobile models: "
                f"×{statistics.median(speedups):.2f}"
            )
    return "\n".join(lines)


def failures(results: Results) -> list[str]:
    """``model / candidate: error`` for each candidate that failed to build, run or be timed."""
    return [
        f"{model} / {name}: {out.error}"
        for model, (_f, outcomes) in results.items()
        for name, out in outcomes.items()
        if out.error
    ]


def to_json(results: Results, args: argparse.Namespace, environment: dict[str, Any]) -> dict:
    """The JSON document: ``environment``, the run's settings, where each candidate runs and on
    which kernels, and per model its FLOPs and each candidate's timing (ms), speedup over eager,
    GFLOP/s, relative error, setup seconds, extras and error."""
    models = {}
    for model, (flops, outcomes) in results.items():
        cands = {}
        for name, out in outcomes.items():
            speedup = _speedup(outcomes, name)
            cands[name] = {
                "timing": None if out.timing is None else out.timing.to_dict(),
                "speedup_vs_eager": speedup,
                "gflops_per_s": _gflops(flops, out),
                "relative_error": out.relative_error,
                "setup_s": out.setup_s,
                "extra": out.extra,
                "error": out.error,
            }
        models[model] = {"flops": flops, "candidates": cands}
    return {
        **environment,
        "threads": args.threads,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "input_shape": list(INPUT_SHAPE),
        "inductor_cache": "warm" if args.warm_compile_cache else "fresh",
        "candidates": {c.name: {"runs_on": c.runs_on, "kernels": c.kernels} for c in CANDIDATES},
        "models": models,
    }


def _available(cands: list[Candidate]) -> list[Candidate]:
    """The candidates whose runtime is here; a line on stderr for each left out."""
    kept = []
    for cand in cands:
        why = None
        if cand.name == "ort":
            try:
                import onnxruntime  # noqa: F401
            except ImportError:
                why = "onnxruntime does not import (pip install -e '.[bench]')"
        elif cand.needs == REFERENCE_RUNTIME and not installed(REFERENCE_RUNTIME):
            why = f"torch {REFERENCE_RUNTIME} is not installed (make runtimes)"
        elif cand.needs == EXECUTORCH:
            try:
                require_peer(EXECUTORCH)
            except RuntimeNotInstalledError:
                why = f"{EXECUTORCH} is not installed (make peers)"
        if why:
            print(f"{cand.name} left out: {why}", file=sys.stderr)
        else:
            kept.append(cand)
    return kept


def start_processes(
    cands: list[Candidate], threads: int, stack: contextlib.ExitStack
) -> dict[str, RuntimeProcess]:
    """One child process per runtime the candidates need, up for the whole run."""
    processes: dict[str, RuntimeProcess] = {}
    for need in dict.fromkeys(c.needs for c in cands if c.needs):
        if need == EXECUTORCH:
            process = RuntimeProcess(
                EXECUTORCH, threads, python=require_peer(EXECUTORCH), script=EXECUTORCH_SCRIPT
            )
        else:
            process = RuntimeProcess(need, threads)
        processes[need] = stack.enter_context(process)
    return processes


def environment(processes: dict[str, RuntimeProcess]) -> dict[str, Any]:
    """What the figures depend on: torch, torchvision and onnxruntime versions (None when it
    does not import), each child's torch, pid and threads, Python, machine, CPU count and
    ``OMP_WAIT_POLICY``."""
    try:
        import onnxruntime

        ort_version: str | None = onnxruntime.__version__
    except ImportError:
        ort_version = None
    return {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "onnxruntime": ort_version,
        "children": {
            name: {"torch": p.info.torch, "pid": p.info.pid, "threads": p.info.threads}
            for name, p in processes.items()
        },
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }


def main() -> None:
    """Run the benchmark from the command line: refuse ``--skip eager`` and models that are not
    torchvision classifiers, leave out candidates whose runtime is missing, start the child
    processes, bench every model and print and write the report.

    Sets torch's thread count and, unless ``--warm-compile-cache``, points
    ``TORCHINDUCTOR_CACHE_DIR`` at a temporary folder for the run (the variable stays set).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", nargs="+", default=list(MODELS), metavar="MODEL", help="torchvision models"
    )
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="threads everywhere (default 2)")
    parser.add_argument(
        "--skip",
        nargs="+",
        default=[],
        choices=NAMES,
        metavar="CANDIDATE",
        help=f"candidates to leave out, of: {' '.join(NAMES)}",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-3,
        help="relative error above which a result is marked ! (default 1e-3)",
    )
    parser.add_argument(
        "--warm-compile-cache",
        action="store_true",
        help="let torch.compile use inductor's on-disk cache (default: a fresh one per run, so "
        "compile times are what a first compile costs)",
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write results")
    args = parser.parse_args()
    if "eager" in args.skip:
        parser.error("eager is the reference for the check and the speedups; it cannot be skipped")
    unknown = sorted(set(args.models) - set(torchvision.models.list_models(torchvision.models)))
    if unknown:
        parser.error(f"not torchvision classification models: {', '.join(unknown)}")

    torch.set_num_threads(args.threads)
    cands = _available([c for c in CANDIDATES if c.name not in args.skip])
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        if not args.warm_compile_cache:
            cache = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_peers_inductor_"))
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # read by inductor on each use
        processes = start_processes(cands, args.threads, stack)
        env = environment(processes)
        results = run_all(args, cands, processes)
    env["load_average_1_5_15"] = {"before": load_before, "after": os.getloadavg()}
    report(results, args, env)


def run_all(
    args: argparse.Namespace, cands: list[Candidate], processes: dict[str, RuntimeProcess]
) -> Results:
    """``bench_model`` for each of ``args.models`` in order, progress on stderr; dynamo's caches
    are reset after each model to free what its compiled candidate held."""
    results: Results = {}
    for model in args.models:
        start = time.perf_counter()
        print(f"{model} ...", file=sys.stderr, flush=True)
        results[model] = bench_model(model, cands, processes, args.rounds, args.warmup)
        torch._dynamo.reset()  # the candidates are gone: free compiled code and memory
        gc.collect()
        print(f"{model} done in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return results


def report(results: Results, args: argparse.Namespace, env: dict[str, Any]) -> None:
    """Print the settings line, the legend (runtime and kernels per column), the latency,
    GFLOP/s, error and setup tables, the summary and the failures; write the JSON to
    ``args.json`` (default ``benchmarks/results/``, git-ignored)."""
    cands = [c for c in CANDIDATES if any(c.name in o for _f, o in results.values())]
    load = env["load_average_1_5_15"]
    print(
        f"torch {torch.__version__}, {args.threads} threads everywhere, batch 1 {INPUT_SHAPE}, "
        f"{args.rounds} interleaved rounds (shuffled each round), median [10th percentile]; "
        f"! = rel. error > {args.tolerance:g}; OMP_WAIT_POLICY={env['omp_wait_policy']}; "
        f"load average before {load['before'][0]:.2f}, after {load['after'][0]:.2f}"
    )
    print(legend(cands))
    print()
    print(latency_table(results, cands, args.tolerance))
    print()
    print(gflops_table(results, cands))
    print()
    print(error_table(results, cands))
    print()
    print(setup_table(results, cands))
    print()
    print(summary(results))
    failed = failures(results)
    if failed:
        print("\nfailed or skipped:")
        print("\n".join(f"  {line}" for line in failed))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(to_json(results, args, env), indent=2) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
