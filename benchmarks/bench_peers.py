"""Benchmark: fxmobile's output against the other ways to run a torchvision model on a CPU.

Why: fxmobile is worth using only if its TorchScript is at least as fast as what a user would
otherwise ship. For each model (random weights, BatchNorm statistics randomized, eval, batch 1,
1x3x224x224, 2 threads) the candidates are built one after another, each is checked against
eager on the same input, and then all of them run interleaved in one ``interleaved_medians``
call (every round runs each candidate once, in a fresh random order):

- ``eager``, and ``eager_cl`` (model and input channels-last);
- ``jit_ofi``: ``torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.script(m)))``;
- ``compile``: ``torch.compile(m)`` (inductor); its compile time is the first call;
- ``ort``: ONNX Runtime on the CPU (only when ``onnxruntime`` imports), graph optimizations ALL;
- ``fxm``: ``fxmobile.optimize(m, example_inputs=x)`` as TorchScript (channels-last
  activations, the CPU default); ``fxm_lite``: the same saved and loaded in the lite
  interpreter; ``fxm_nchw``: ``optimize(..., channels_last=False)``, eager's layout kept.

The table gives median ms and the speedup over eager (eager / candidate); a ``!`` marks a
candidate whose output is off eager by more than ``--tolerance`` (max abs error relative to the
largest eager output magnitude), so a fast wrong answer shows. GFLOP/s counts the eager model's
FLOPs once (``FlopCounterMode``). A candidate that fails to build or run is recorded with its
error and the run goes on. Compare ratios within a model; absolute figures move with load.

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
# to every candidate alike (ONNX Runtime keeps its own thread pool's defaults).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.jit.mobile
import torchvision
from tabulate import tabulate
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import fxmobile
from fxmobile.timing import Timing, interleaved_medians
from fxmobile.verify import compare_outputs

# model_zoo_checks is a folder of the repository, not part of the installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fxmobile.verify import randomize_batchnorm_statistics

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


@dataclass
class Built:
    """A ready-to-time candidate: ``run`` calls it on the model's input."""

    run: Callable[[], Any]
    setup_s: float  # building it: scripting, compiling, exporting, optimizing
    # the candidate's output as a tensor, for the check against eager
    as_tensor: Callable[[Any], Any] = lambda out: out
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Ctx:
    """What every builder gets: the eager model, its input, a scratch folder, and what earlier
    builders kept for later ones."""

    model: nn.Module
    x: torch.Tensor
    workdir: Path
    keep: dict[str, Any]  # objects a later builder reuses (the fxmobile results)


@dataclass(frozen=True)
class Candidate:
    name: str
    label: str  # column header
    build: Callable[[Ctx], Built]
    needs: str | None = None  # a candidate whose build this one reuses


@dataclass
class Outcome:
    timing: Timing | None = None
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


def build_eager(ctx: Ctx) -> Built:
    model, x = ctx.model, ctx.x
    return Built(lambda: model(x), 0.0)


def build_eager_cl(ctx: Ctx) -> Built:
    cl = torch.channels_last
    model = copy.deepcopy(ctx.model).to(memory_format=cl)
    x = ctx.x.contiguous(memory_format=cl)
    return Built(lambda: model(x), 0.0)


def build_jit_ofi(ctx: Ctx) -> Built:
    def make() -> torch.jit.ScriptModule:
        frozen = torch.jit.freeze(torch.jit.script(copy.deepcopy(ctx.model)))
        return torch.jit.optimize_for_inference(frozen)

    module, seconds = _timed(make)
    x = ctx.x
    return Built(lambda: module(x), seconds)


def build_compile(ctx: Ctx) -> Built:
    compiled = torch.compile(copy.deepcopy(ctx.model))
    x = ctx.x
    with torch.no_grad():  # grad mode is a guard: compile for the mode the timing runs in
        _, seconds = _timed(lambda: compiled(x))
    return Built(lambda: compiled(x), seconds, extra={"compile_s": seconds})


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
            torch.onnx.export(model, (x,), buffer, dynamo=False)
        except Exception as legacy_error:
            raise RuntimeError(
                f"dynamo exporter: {_first_line(dynamo_error)}; "
                f"dynamo=False: {_first_line(legacy_error)}"
            ) from legacy_error
        return buffer.getvalue(), "torchscript"


def build_ort(ctx: Ctx) -> Built:
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
    return Built(
        lambda: session.run(None, feed),
        export_s + session_s,
        as_tensor=lambda outs: torch.from_numpy(outs[0]),
        extra={
            "export_s": export_s,
            "session_s": session_s,
            "dynamo_exporter": exporter == "dynamo",
        },
    )


def _fxmobile(ctx: Ctx, key: str, **options: Any) -> Built:
    result, seconds = _timed(lambda: fxmobile.optimize(ctx.model, example_inputs=ctx.x, **options))
    ctx.keep[key] = result
    module, x = result.module, ctx.x
    extra = {"optimize_s": seconds, "fxmobile_check_passed": result.report.numerics_passed}
    return Built(lambda: module(x), seconds, extra=extra)


def build_fxm(ctx: Ctx) -> Built:
    """The defaults: on the CPU backend, activations run channels-last."""
    return _fxmobile(ctx, "fxm")


def build_fxm_nchw(ctx: Ctx) -> Built:
    """``channels_last=False``: eager's layout kept, to show what the layout is worth."""
    return _fxmobile(ctx, "fxm_nchw", channels_last=False)


def build_fxm_lite(ctx: Ctx) -> Built:
    path = ctx.workdir / "fxm.ptl"

    def make() -> Any:
        ctx.keep["fxm"].save(path)
        return torch.jit.mobile._load_for_lite_interpreter(str(path))

    module, seconds = _timed(make)
    path.unlink()
    x = ctx.x
    return Built(lambda: module(x), seconds)


CANDIDATES = (
    Candidate("eager", "eager", build_eager),
    Candidate("eager_cl", "eager CL", build_eager_cl),
    Candidate("jit_ofi", "jit freeze+ofi", build_jit_ofi),
    Candidate("compile", "compile", build_compile),
    Candidate("ort", "ORT", build_ort),
    Candidate("fxm", "fxm", build_fxm),
    Candidate("fxm_lite", "fxm lite", build_fxm_lite, needs="fxm"),
    Candidate("fxm_nchw", "fxm NCHW", build_fxm_nchw),
)
NAMES = tuple(c.name for c in CANDIDATES)


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 300 else text[:297] + "..."


def build_model(name: str) -> nn.Module:
    model = torchvision.models.get_model(name, weights=None)
    return randomize_batchnorm_statistics(model, INPUT_SHAPE)


def count_flops(model: nn.Module, x: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    return int(counter.get_total_flops())


def bench_model(
    name: str, candidates: list[Candidate], rounds: int, warmup: int
) -> tuple[int, dict[str, Outcome]]:
    """FLOPs of ``name`` and one ``Outcome`` per candidate, failures included."""
    torch.manual_seed(0)
    model = build_model(name)
    x = torch.randn(INPUT_SHAPE)
    flops = count_flops(model, x)
    with torch.no_grad():
        reference = model(x)
    outcomes: dict[str, Outcome] = {}
    runs: dict[str, Callable[[], Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Ctx(model, x, Path(tmp), {})
        for cand in candidates:
            outcome = outcomes[cand.name] = Outcome()
            if cand.needs is not None and cand.needs not in ctx.keep:
                outcome.error = f"skipped: needs {cand.needs}, which was skipped or failed"
                continue
            try:
                built = cand.build(ctx)
                with torch.no_grad(), _quiet():
                    actual = built.as_tensor(built.run())
                (check,) = compare_outputs(reference, actual)
            except Exception as exc:
                outcome.error = _first_line(exc)
                print(f"  {name}: {cand.name} failed: {outcome.error}", file=sys.stderr)
                continue
            outcome.setup_s, outcome.extra = built.setup_s, built.extra
            outcome.relative_error = check.relative_error
            runs[cand.name] = built.run
        for cand_name, timing in _time_all(name, runs, outcomes, rounds, warmup).items():
            outcomes[cand_name].timing = timing
    return flops, outcomes


def _time_all(
    model: str,
    runs: dict[str, Callable[[], Any]],
    outcomes: dict[str, Outcome],
    rounds: int,
    warmup: int,
) -> dict[str, Timing]:
    """``interleaved_medians`` of ``runs``; a candidate that fails while timed (after a first
    call that worked) gets the error in its outcome, and the others are timed again."""
    try:
        with _quiet():
            return interleaved_medians(runs, rounds=rounds, warmup=warmup)
    except Exception as exc:
        print(f"  {model}: timing failed ({_first_line(exc)}); retrying", file=sys.stderr)
    working = {}
    for name, run in runs.items():
        try:
            with torch.no_grad(), _quiet():
                run()
            working[name] = run
        except Exception as exc:
            outcomes[name].error = f"failed while timed: {_first_line(exc)}"
    with _quiet():
        return interleaved_medians(working, rounds=rounds, warmup=warmup) if working else {}


def _speedup(outcomes: dict[str, Outcome], name: str) -> float | None:
    base, cand = outcomes.get("eager"), outcomes.get(name)
    if base is None or cand is None or base.timing is None or cand.timing is None:
        return None
    return base.timing.median_ms / cand.timing.median_ms


def latency_table(results: Results, cands: list[Candidate], tol: float) -> str:
    rows = []
    for model, (_flops, outcomes) in results.items():
        row: list[object] = [model]
        for cand in cands:
            out = outcomes[cand.name]
            if out.timing is None:
                row.append("failed" if out.error and not out.error.startswith("skip") else "-")
                continue
            cell = f"{out.timing.median_ms:.2f} (×{_speedup(outcomes, cand.name) or 0:.2f})"
            if out.relative_error is not None and out.relative_error > tol:
                cell += " !"
            row.append(cell)
        rows.append(row)
    return tabulate(rows, headers=["ms (×speedup)", *(c.label for c in cands)])


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
    return None if out.timing is None else flops / (out.timing.median_ms * 1e-3) / 1e9


def gflops_table(results: Results, cands: list[Candidate]) -> str:
    return _grid(results, cands, "GFLOP/s", _gflops, ".1f")


def error_table(results: Results, cands: list[Candidate]) -> str:
    return _grid(results, cands, "rel. error vs eager", lambda _f, o: o.relative_error, ".1e")


def setup_table(results: Results, cands: list[Candidate]) -> str:
    """Seconds to build each candidate: scripting, first compiled call, export, optimize."""
    built = [c for c in cands if c.name not in ("eager", "eager_cl")]
    table = _grid(results, built, "setup s", lambda _f, o: o.setup_s, ".2f")
    flops = ", ".join(f"{model} {f / 1e9:.2f}" for model, (f, _o) in results.items())
    return f"{table}\nGFLOP per inference: {flops}"


def summary(results: Results) -> str:
    lines = []
    rows = []
    for model, (_f, outcomes) in results.items():
        ofi = outcomes.get("jit_ofi")
        row: list[object] = [model]
        for name in ("fxm", "fxm_lite", "fxm_nchw"):
            out = outcomes.get(name)
            if ofi is None or ofi.timing is None or out is None or out.timing is None:
                row.append(None)
            else:
                row.append(ofi.timing.median_ms / out.timing.median_ms)
        rows.append(row)
    lines.append(
        tabulate(
            rows,
            headers=[
                "jit freeze+ofi / fxm (>1: fxm faster)",
                "fxm",
                "fxm lite",
                "fxm NCHW",
            ],
            floatfmt=".2f",
            missingval="-",
        )
    )
    for name in ("fxm", "fxm_lite", "fxm_nchw"):
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
    return [
        f"{model} / {name}: {out.error}"
        for model, (_f, outcomes) in results.items()
        for name, out in outcomes.items()
        if out.error
    ]


def to_json(results: Results, args: argparse.Namespace) -> dict:
    try:
        import onnxruntime

        ort_version: str | None = onnxruntime.__version__
    except ImportError:
        ort_version = None
    models = {}
    for model, (flops, outcomes) in results.items():
        cands = {}
        for name, out in outcomes.items():
            speedup = _speedup(outcomes, name)
            cands[name] = {
                "timing": None if out.timing is None else out.timing.to_dict(),
                "speedup_vs_eager": speedup,
                "gflops_per_s": None
                if out.timing is None
                else flops / (out.timing.median_ms * 1e-3) / 1e9,
                "relative_error": out.relative_error,
                "setup_s": out.setup_s,
                "extra": out.extra,
                "error": out.error,
            }
        models[model] = {"flops": flops, "candidates": cands}
    return {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "onnxruntime": ort_version,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": args.threads,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "input_shape": list(INPUT_SHAPE),
        "inductor_cache": "warm" if args.warm_compile_cache else "fresh",
        "models": models,
    }


def _available(cands: list[Candidate]) -> list[Candidate]:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("onnxruntime does not import: ORT left out", file=sys.stderr)
        return [c for c in cands if c.name != "ort"]
    return cands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", nargs="+", default=list(MODELS), metavar="MODEL", help="torchvision models"
    )
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
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
    with contextlib.ExitStack() as stack:
        if not args.warm_compile_cache:
            cache = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_peers_inductor_"))
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # read by inductor on each use
        results = run_all(args)
    report(results, args)


def run_all(args: argparse.Namespace) -> Results:
    cands = _available([c for c in CANDIDATES if c.name not in args.skip])
    results: Results = {}
    for model in args.models:
        start = time.perf_counter()
        print(f"{model} ...", file=sys.stderr, flush=True)
        results[model] = bench_model(model, cands, args.rounds, args.warmup)
        torch._dynamo.reset()  # the candidates are gone: free compiled code and memory
        gc.collect()
        print(f"{model} done in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return results


def report(results: Results, args: argparse.Namespace) -> None:
    cands = [c for c in CANDIDATES if any(c.name in o for _f, o in results.values())]
    print(
        f"torch {torch.__version__}, {args.threads} threads, batch 1 {INPUT_SHAPE}, "
        f"{args.rounds} interleaved rounds, medians; ! = rel. error > {args.tolerance:g}; "
        f"inductor cache {'warm' if args.warm_compile_cache else 'fresh'}"
    )
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
    args.json.write_text(json.dumps(to_json(results, args), indent=2) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
