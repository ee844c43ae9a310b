"""Benchmark: how long ``fxmobile.optimize`` takes, against ``torch.jit.script`` + ``freeze``.

Why: fxmobile replaces a script-and-freeze step in a user's export script; the target is to
take at most 1.5x as long. Both run on the same model (resnet50 by default, random weights,
BatchNorm statistics randomized, eval) in one process, interleaved: each repetition runs both
once, in a fresh random order, and the medians are compared. ``fxmobile.optimize`` runs with
``example_inputs``, so its time includes the numerical checks against eager; a third
candidate runs it without, to show what the checks and shape propagation cost.

The breakdown says where fxmobile's time goes. fxmobile's own report gives each pass's
seconds; the stages around the passes (tracing, scripting, the checks, the lite-interpreter
size and the lints) are timed from outside, by wrapping the functions ``fxmobile.api``
calls for the duration of the fxmobile runs only. ``--profile`` then runs one
more ``fxmobile.optimize`` under cProfile and lists the top cumulative entries.

TorchScript caches what it compiled per module type, so the warm-up run makes later scripting
of the same model cheaper; ``--cold`` also times each candidate's first call in fresh processes.

Run from the repository root: ``python benchmarks/bench_optimize_time.py [--model resnet50]``;
``--write-docs`` also writes the medians into the performance page (``benchmarks/figures.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import functools
import importlib
import io
import pstats
import statistics
import subprocess
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torchvision
from tabulate import tabulate
from torch import nn

# run by path (python benchmarks/...), the repository root is not on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fxmobile
from benchmarks import figures
from fxmobile.timing import interleaved_medians
from fxmobile.verify import randomize_batchnorm_statistics

# The block of docs/pages/performance.md that --write-docs fills.
FIGURES = "optimize-time"

INPUT_SHAPE = (1, 3, 224, 224)
# fxmobile.optimize without example_inputs: no numerical checks and no passes that need shapes,
# so the floor of what the checks and shape propagation cost.
NO_INPUTS = "fxmobile.optimize, no example_inputs"

# (module, attribute, label): the steps of fxmobile.optimize timed from outside, in call order;
# indented labels run inside the unindented one above them. The eager reference and the check
# run are verification: fxmobile's report counts them apart (optimize_seconds, check_seconds).
STAGES = (
    ("fxmobile.api.fx_flow", "fx_stage", "FX stage"),
    ("fxmobile.api.fx_flow", "capture", "  capture: copy + symbolic trace"),
    ("fxmobile.capture.reference", "reference_outputs", "  eager reference runs (check)"),
    ("fxmobile.api.script_flow", "to_torchscript", "torch.jit.script of the graph module"),
    ("fxmobile.api.script_flow", "script_stage", "TorchScript stage"),
    ("fxmobile.api.script_flow", "op_histogram", "  op histograms"),
    ("fxmobile.api.script_flow", "unfused_ops", "  unfused op count"),
    ("fxmobile.api.results", "lite_interpreter_bytes", "  lite-interpreter bytes (file size)"),
    ("fxmobile.api.script_flow", "generate_mobile_module_lints", "  lints"),
    ("fxmobile.api.gate", "run_calls", "optimized module run (check)"),
)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=r".*Lite Interpreter is deprecated")
        yield


@contextlib.contextmanager
def stopwatch(spent: dict[str, float]) -> Iterator[None]:
    """Adds each ``STAGES`` entry's wall time to ``spent[label]`` while the block runs."""
    undo: list[Callable[[], None]] = []

    def wrap(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - start

        return timed

    try:
        for module_name, attr, label in STAGES:
            owner: Any = importlib.import_module(module_name)
            *path, name = attr.split(".")
            for part in path:
                owner = getattr(owner, part)
            own = owner.__dict__.get(name)  # None when a class inherits it
            original = getattr(owner, name)
            setattr(owner, name, wrap(original, label))
            undo.append(
                functools.partial(delattr, owner, name)
                if own is None
                else functools.partial(setattr, owner, name, own)
            )
        yield
    finally:
        for restore in reversed(undo):
            restore()


def build_model(name: str) -> nn.Module:
    """torchvision's ``name`` with random weights (seed 0), BatchNorm statistics randomized
    at ``INPUT_SHAPE``, in eval mode."""
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None)
    return randomize_batchnorm_statistics(model, INPUT_SHAPE)


def script_freeze(model: nn.Module) -> torch.jit.ScriptModule:
    """The baseline candidate: ``torch.jit.freeze(torch.jit.script(model))``, what a user's
    export script runs without fxmobile. Puts ``model`` in eval mode."""
    with _quiet():
        return torch.jit.freeze(torch.jit.script(model.eval()))


@dataclass
class FxmobileRun:
    """One ``fxmobile.optimize`` call: seconds per ``STAGES`` label (and "total"), per pass."""

    stages: dict[str, float]
    passes: dict[str, float]
    optimize_seconds: float  # the report's: everything but the two check runs


def _quiet_optimize(model: nn.Module) -> None:
    with _quiet():
        fxmobile.optimize(model)


def measure(
    model: nn.Module, x: torch.Tensor, reps: int
) -> tuple[dict[str, float], float, FxmobileRun]:
    """Median seconds per candidate; the median of the fxmobile runs' ``optimize_seconds`` (what
    the 1.5x target is about: the check runs do not count); and the fxmobile run whose total is
    the median one (its parts add up to its total, which medians taken part by part would
    not)."""
    runs: list[FxmobileRun] = []

    def run_fxmobile() -> None:
        spent: dict[str, float] = defaultdict(float)
        with stopwatch(spent), _quiet():
            start = time.perf_counter()
            result = fxmobile.optimize(model, example_inputs=x)
            spent["total"] = time.perf_counter() - start
        passes = {f"{r.stage.value} {r.name}": r.seconds for r in result.report.passes}
        optimize_seconds = result.report.optimize_seconds
        assert optimize_seconds is not None
        runs.append(FxmobileRun(dict(spent), passes, optimize_seconds))

    timings = interleaved_medians(
        {
            "script+freeze": lambda: script_freeze(model),
            "fxmobile.optimize": run_fxmobile,
            NO_INPUTS: lambda: _quiet_optimize(model),
        },
        rounds=reps,
        warmup=1,
    )
    timed = sorted(runs[1:], key=lambda r: r.stages["total"])  # runs[0] was the warm-up
    unchecked = statistics.median(r.optimize_seconds for r in timed)
    medians = {name: t.median_ms / 1000 for name, t in timings.items()}
    return medians, unchecked, timed[(len(timed) - 1) // 2]


def cold_seconds(model_name: str, candidate: str, reps: int, threads: int) -> list[list[float]]:
    """First-call seconds of ``candidate``, each in a fresh process: per process, the call's
    seconds and, for fxmobile, its report's ``optimize_seconds`` (the check runs left out)."""
    command = [sys.executable, __file__, "--model", model_name, "--threads", str(threads)]
    command += ["--child", candidate]
    out = []
    for _ in range(reps):
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        out.append([float(v) for v in done.stdout.strip().splitlines()[-1].split()])
    return out


def child(model_name: str, candidate: str) -> None:
    """The process ``cold_seconds`` starts: build the model, run ``candidate`` once
    ("script+freeze", or "fxmobile": ``optimize`` with example inputs) and print its seconds
    (and fxmobile's ``optimize_seconds``) as the last stdout line. Building the model is not
    timed."""
    model = build_model(model_name)
    x = torch.randn(INPUT_SHAPE)
    start = time.perf_counter()
    if candidate == "script+freeze":
        script_freeze(model)
        print(time.perf_counter() - start)
        return
    with _quiet():
        result = fxmobile.optimize(model, example_inputs=x)
    print(time.perf_counter() - start, result.report.optimize_seconds)


def breakdown_table(run: FxmobileRun) -> str:
    """``run``'s seconds and share of its total per ``STAGES`` label that ran; indented labels
    are parts of the stage above and are left out of the rest, which is the total minus the
    top-level stages."""
    total = run.stages["total"]
    rows: list[list[object]] = []
    outer = 0.0
    for _module, _attr, label in STAGES:
        if label in run.stages:
            seconds = run.stages[label]
            rows.append([label, seconds, 100 * seconds / total])
            outer += 0.0 if label.startswith(" ") else seconds
    rest = total - outer
    rows.append(["rest (argument checks, deep copy, markers)", rest, 100 * rest / total])
    rows.append(["total", total, 100.0])
    return tabulate(rows, headers=["fxmobile.optimize step", "s", "%"], floatfmt=".2f")


def pass_table(run: FxmobileRun, top: int) -> str:
    """The ``top`` slowest passes of ``run`` by the seconds fxmobile's report gives, and the
    sum over all of them."""
    ranked = sorted(run.passes.items(), key=lambda item: item[1], reverse=True)
    rows: list[list[object]] = [[name, seconds] for name, seconds in ranked[:top]]
    rows.append(["all passes", sum(run.passes.values())])
    return tabulate(rows, headers=["pass (from the report)", "s"], floatfmt=".3f")


def profile(model: nn.Module, x: torch.Tensor, top: int) -> str:
    """One ``fxmobile.optimize(model, example_inputs=x)`` under cProfile: the ``top`` entries
    by cumulative time, as pstats prints them."""
    profiler = cProfile.Profile()
    with _quiet():
        profiler.enable()
        fxmobile.optimize(model, example_inputs=x)
        profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("cumulative").print_stats(top)
    return stream.getvalue()


def main() -> None:
    """Print the interleaved medians (seconds, and each ratio to script+freeze, against the
    1.5x target), the cold first calls with ``--cold``, the breakdown of fxmobile's median
    repetition, its slowest passes, and the profile with ``--profile``. All on the CPU with
    ``--threads`` torch threads, in this process (the ``--cold`` calls in fresh ones)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50", help="torchvision model (default resnet50)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument(
        "--cold", type=int, default=0, metavar="N", help="also time N first calls in new processes"
    )
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="cProfile one run, list N entries"
    )
    parser.add_argument("--child", choices=["script+freeze", "fxmobile"], help=argparse.SUPPRESS)
    figures.add_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        child(args.model, args.child)
        return

    load_before, _ = figures.load()
    model = build_model(args.model)
    x = torch.randn(INPUT_SHAPE)
    medians, unchecked, median_run = measure(copy.deepcopy(model), x, args.reps)
    base, ours = medians["script+freeze"], medians["fxmobile.optimize"]
    print(
        f"{args.model}, torch {torch.__version__}, {args.threads} threads, "
        f"{args.reps} interleaved repetitions after 1 warm-up, medians"
    )
    bare = medians[NO_INPUTS]
    print(f"script+freeze                         {base:7.2f} s")
    print(f"fxmobile.optimize                     {ours:7.2f} s   ratio {ours / base:.2f}x")
    print(f"{NO_INPUTS}  {bare:7.2f} s   ratio {bare / base:.2f}x")
    print(
        f"fxmobile.optimize without its check runs  {unchecked:.2f} s   "
        f"ratio {unchecked / base:.2f}x   (target: <= 1.5x script+freeze)"
    )
    if args.cold:
        cold = {
            c: cold_seconds(args.model, c, args.cold, args.threads)
            for c in ("script+freeze", "fxmobile")
        }
        cb = statistics.median(run[0] for run in cold["script+freeze"])
        co = statistics.median(run[0] for run in cold["fxmobile"])
        cu = statistics.median(run[1] for run in cold["fxmobile"])
        print(
            f"first call in a fresh process (median of {args.cold}): script+freeze {cb:.2f} s, "
            f"fxmobile {co:.2f} s, ratio {co / cb:.2f}x; without its check runs {cu:.2f} s, "
            f"ratio {cu / cb:.2f}x"
        )
    if args.write_docs:
        rows: list[list[object]] = [
            [f"{args.model}, warm: {name}", seconds, seconds / base]
            for name, seconds in [
                *medians.items(),
                ("fxmobile.optimize without its check runs", unchecked),
            ]
        ]
        if args.cold:
            rows += [
                [f"{args.model}, fresh process: script+freeze", cb, 1.0],
                [f"{args.model}, fresh process: fxmobile.optimize", co, co / cb],
                [f"{args.model}, fresh process: without its check runs", cu, cu / cb],
            ]
        run = figures.finish(
            runtime=f"torch {torch.__version__}",
            kernels="ATen and fxmobile._C (the check runs)",
            threads=args.threads,
            load_before=load_before,
        )
        table = figures.markdown_table(["candidate", "median s", "x script+freeze"], rows, ".2f")
        figures.write(FIGURES, table, run)
    print("\nWhere fxmobile's time goes, in its median repetition:")
    print(breakdown_table(median_run))
    print()
    print(pass_table(median_run, top=10))
    if args.profile:
        print()
        print(profile(model, x, args.profile))


if __name__ == "__main__":
    main()
