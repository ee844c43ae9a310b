"""Benchmark: fxmobile's ExecuTorch program against ExecuTorch's own, and the other ways to ship.

Why: the ExecuTorch target is worth using only if fxmobile's program runs faster than the one
ExecuTorch's own flow makes of the same model, and it is meant to: it leaves fewer ops outside
the XNNPACK delegate, in fewer partitions. For each model (random weights, BatchNorm statistics
randomized, eval, batch 1) the candidates are built one after another, each is checked against
eager on the same input, and all are timed interleaved at each thread count (every round runs
each candidate once, in a fresh random order, wherever it lives), with the median and the 10th
percentile: ExecuTorch's thread pool is bimodal at 2 threads on a shared 2-core machine, and the
10th percentile is what the machine gives when nothing else runs.

Candidates (each names the runtime it ran on and its kernels):

- ``eager``: the model, torch here (ATen);
- ``pte_fxm``: ``fxmobile.optimize(m, example_inputs=x, target_runtime="executorch")``, run by
  ExecuTorch's runtime in this process (XNNPACK delegate, portable kernels outside it);
- ``pte_et``: ExecuTorch's own flow on the same weights (``torch.export``,
  ``to_edge_transform_and_lower`` with ``XnnpackPartitioner``, ``to_executorch``), the same
  runtime in the same process;
- ``ptl_212``: fxmobile's lite-interpreter file in the real torch 2.12.1 runtime, on its XNNPACK
  kernels (``make runtimes``; one child process per thread count);
- ``ort``: ONNX Runtime's CPU execution provider in this process (``pip install -e '.[bench]'``).

Both ExecuTorch programs share the process's XNNPACK thread pool, sized to each thread count
before its rounds. Per model the table also gives each program's delegate calls and ops left on
portable kernels, and the seconds each flow took to make it. Models: torchvision names, zoo
keys (``python -m model_zoo_checks --list``), or ``timm:NAME`` for any timm model; the
ecosystem entries (``transformers:deit``) need ``pip install -e '.[ecosystem]'``, checked before
the first model.

Where fxmobile's program misses its target at a thread count (or at every one, ``--profile``),
both programs are then profiled per op at that count, in this process, from their ETDumps
(``executorch_op_profile.py``): per op kind, the calls per run and the median microseconds per
run of each program, side by side (XNNPACK operator kinds inside the delegate, each op on a
portable kernel, the ``DELEGATE_CALL`` spans and ``Method::execute``). ``--json F`` also writes
every figure, the profiles included.

Run from the repository root, on a quiet machine:
``python benchmarks/bench_executorch.py [--models ...] [--threads 1 2] [--rounds N] [--profile]``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see bench_peers.py
# run by path (python benchmarks/...), the repository root is not on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tabulate import tabulate
from torch import nn
from torch.utils import _pytree as pytree

import fxmobile
from benchmarks import executorch_op_profile as op_profile
from benchmarks import figures
from benchmarks.bench_peers import REFERENCE_RUNTIME, build_ort
from benchmarks.bench_peers import Ctx as PeerCtx
from fxmobile.executorch.export import export_module
from fxmobile.executorch.lower import lower
from fxmobile.executorch.runtime import ProgramRunner, set_threads
from fxmobile.runtime import RuntimeProcess, installed
from fxmobile.runtime.latency import Here, Latency, OnRuntime, compare_latency
from fxmobile.verify import compare_outputs
from model_zoo_checks import ecosystem
from model_zoo_checks.timm_models import PREFIX, input_shape
from model_zoo_checks.zoo import Kind, ZooModel, all_models

CNNS = (
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "shufflenet_v2_x1_0",
    "squeezenet1_1",
    "regnet_y_400mf",
    "mnasnet1_0",
    "resnet18",
    "resnet50",
)
TRANSFORMERS = (
    "timm:deit_tiny_patch16_224",
    "timm:deit_small_patch16_224",
    "timm:swin_tiny_patch4_window7_224",
    "timm:mobilevit_xxs",
    "timm:mobilevit_s",
    "timm:efficientformer_l1",
    "timm:levit_128s",
    "timm:edgenext_xx_small",
    "transformers:deit",
    "transformers:swin",
    "transformers:mobilevit",
    "transformers:segformer",
)
# The target per kind: a program never slower than ExecuTorch's own; CNNs share kernels with it
# (within 5%), transformer-style models at least 1.3x faster.
TARGETS = {"cnn": 0.95, "transformer": 1.3}
NAMES = ("eager", "pte_fxm", "pte_et", "ptl_212", "ort")
PROFILED = ("pte_fxm", "pte_et")  # the programs profiled per op, in the profile's column order
# The blocks of docs/pages/performance.md that --write-docs fills: a table per thread count
# (1 and 2; other counts are printed only), and the seconds each flow took.
THREAD_FIGURES = {1: "executorch-1-thread", 2: "executorch-2-thread"}
FLOW_FIGURES = "executorch-flow-seconds"
FIGURES = (*THREAD_FIGURES.values(), FLOW_FIGURES)
KERNELS = {
    "eager": "ATen",
    "pte_fxm": "XNNPACK delegate",
    "pte_et": "XNNPACK delegate",
    "ptl_212": "XNNPACK",
    "ort": "ORT CPU EP (MLAS)",
}


@dataclass
class Program:
    """An ExecuTorch program of the model: its bytes, delegate calls, portable ops, seconds."""

    buffer: bytes
    out_spec: Any
    delegate_calls: int
    portable_ops: int
    seconds: float
    nbytes: int


@dataclass
class ModelRun:
    """Everything measured on one model."""

    name: str
    kind: str
    programs: dict[str, Program] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    relative_error: dict[str, float] = field(default_factory=dict)
    latency: dict[int, dict[str, Latency]] = field(default_factory=dict)  # threads -> candidate
    # threads -> program (pte_fxm, pte_et) -> its per-op profile
    profiles: dict[int, dict[str, op_profile.Profile]] = field(default_factory=dict)


def entry(spec: str) -> ZooModel:
    """The zoo entry ``spec`` names: a catalogue name or key, or ``timm:NAME`` for any timm
    model (built as the zoo's timm kind builds it)."""
    for model in all_models():
        if spec in (model.name, model.key):
            return model
    if spec.startswith(PREFIX):
        return ZooModel(spec, Kind.TIMM, input_shape(spec.removeprefix(PREFIX)), "bench")
    raise SystemExit(f"bench_executorch: no model {spec!r} (see python -m model_zoo_checks --list)")


def kind_of(model: ZooModel) -> str:
    """ "cnn" for the torchvision classifiers, "transformer" for the attention models."""
    return "cnn" if model.name in CNNS else "transformer"


def first_tensor(value: Any) -> torch.Tensor:
    """The first tensor of an output (a ModelOutput, a tuple...), the one every candidate is
    compared on."""
    return next(x for x in pytree.tree_leaves(value) if isinstance(x, torch.Tensor))


def own_flow(model: nn.Module, inputs: tuple[Any, ...]) -> Program:
    """ExecuTorch's own flow, as its XNNPACK tutorial gives it, timed."""
    start = time.perf_counter()
    exported = export_module(copy.deepcopy(model), inputs, type(model).__name__)
    lowered = lower(exported, type(model).__name__)
    seconds = time.perf_counter() - start
    facts = lowered.facts
    return Program(
        lowered.buffer,
        exported.call_spec.out_spec,
        facts.delegate_calls,
        facts.portable_count,
        seconds,
        facts.nbytes,
    )


def fxmobile_flow(model: nn.Module, inputs: tuple[Any, ...]) -> Program:
    """fxmobile's ExecuTorch target, timed (its check runs included: they are part of it)."""
    start = time.perf_counter()
    result = fxmobile.optimize(model, example_inputs=inputs, target_runtime="executorch")
    seconds = time.perf_counter() - start
    facts = result.report.program
    runner = result.runner
    assert facts is not None and isinstance(runner, ProgramRunner)
    return Program(
        result.buffer,
        runner.out_spec,
        facts.delegate_calls,
        facts.portable_count,
        seconds,
        facts.nbytes,
    )


def bench(
    spec: str,
    threads: list[int],
    children: dict[int, RuntimeProcess],
    rounds: int,
    profile_runs: int = 10,
    always_profile: bool = False,
) -> ModelRun:
    """Build every candidate for ``spec``, time them at each thread count, then profile both
    programs per op (``profile_runs`` runs) at each count where fxmobile's misses its target,
    or at every count with ``always_profile``."""
    model_entry = entry(spec)
    run = ModelRun(model_entry.key, kind_of(model_entry))
    model = model_entry.build_randomized(0)
    inputs = model_entry.example_inputs(0)
    with torch.no_grad():
        reference = first_tensor(model(*inputs))
    runs: dict[str, Any] = {"eager": lambda: model(*inputs)}
    for name, make in (("pte_et", own_flow), ("pte_fxm", fxmobile_flow)):
        try:
            run.programs[name] = make(model, inputs)
        except Exception as exc:
            run.errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        ptl = Path(tmp) / "model.ptl"
        if children:
            try:
                fxmobile.optimize(model, example_inputs=inputs).save(ptl)
            except Exception as exc:
                run.errors["ptl_212"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if len(inputs) == 1 and isinstance(inputs[0], torch.Tensor):
            try:
                ctx = PeerCtx(run.name, model, inputs[0], Path(tmp), {}, {})
                ort = build_ort(ctx)
                runs["ort"] = ort.run
                run.relative_error["ort"] = _error(reference, ort.as_tensor(ort.run()))
            except Exception as exc:
                run.errors["ort"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        for count in threads:
            torch.set_num_threads(count)
            # the XNNPACK pool is replaced: a program loaded before would run on the freed one
            set_threads(count)
            for name, program in run.programs.items():
                runner = ProgramRunner(program.buffer, program.out_spec)
                runs[name] = lambda r=runner: r(*inputs)
                with torch.no_grad():
                    run.relative_error[name] = _error(reference, first_tensor(runs[name]()))
            timers: dict[str, Any] = {
                name: Here(fn, (), KERNELS[name]) for name, fn in runs.items()
            }
            if count in children and ptl.exists() and "ptl_212" not in run.errors:
                loaded = stack.enter_context(contextlib.closing(children[count].load(ptl)))
                timers["ptl_212"] = OnRuntime(loaded, inputs)
            run.latency[count] = compare_latency(timers, rounds=rounds, warmup=3)
    for count in threads:
        verdict = meets(run, count)
        if verdict is None or (verdict and not always_profile):
            continue
        torch.set_num_threads(count)
        set_threads(count)
        buffers = {name: run.programs[name].buffer for name in PROFILED}
        try:
            run.profiles[count] = op_profile.profile(buffers, inputs, runs=profile_runs)
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            run.errors[f"profile at {count} threads"] = error
    return run


def _error(reference: torch.Tensor, actual: torch.Tensor) -> float:
    (check,) = compare_outputs(reference, actual, 1.0)
    return check.relative_error


def ratio(run: ModelRun, threads: int) -> float | None:
    """ExecuTorch's own program's median over fxmobile's: above 1, fxmobile's is faster."""
    found = run.latency.get(threads, {})
    if "pte_fxm" not in found or "pte_et" not in found:
        return None
    return found["pte_et"].timing.median_ms / found["pte_fxm"].timing.median_ms


def table(runs: list[ModelRun], threads: int, fmt: str = "github") -> str:
    """One row per model: each candidate's median ms [p10], the ratio, and the programs."""
    rows = []
    for run in runs:
        found = run.latency.get(threads, {})
        cells = []
        for name in NAMES:
            if name in found:
                t = found[name].timing
                cells.append(f"{t.median_ms:.2f} [{t.p10_ms:.2f}]")
            else:
                cells.append("failed" if name in run.errors else "-")
        r = ratio(run, threads)
        programs = [
            f"{p.delegate_calls} / {p.portable_ops}" if (p := run.programs.get(name)) else "-"
            for name in ("pte_fxm", "pte_et")
        ]
        rows.append([run.name, *cells, f"{r:.2f}x" if r else "-", *programs])
    headers = [
        "model",
        "eager (ATen)",
        "fxmobile .pte (ExecuTorch, XNNPACK)",
        "ExecuTorch's own .pte (XNNPACK)",
        "fxmobile .ptl on torch 2.12.1 (XNNPACK)",
        "ONNX Runtime (MLAS)",
        "own / fxmobile",
        "fxmobile: delegates / portable ops",
        "own: delegates / portable ops",
    ]
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def meets(run: ModelRun, threads: int) -> bool | None:
    """Whether fxmobile's program meets its kind's target by medians at ``threads``; None when
    either program was not timed there."""
    r = ratio(run, threads)
    return None if r is None else r >= TARGETS[run.kind]


def verdicts(runs: list[ModelRun], threads: list[int]) -> list[str]:
    """Each model against its kind's target, at each thread count (median and p10 ratios)."""
    lines = []
    for run in runs:
        for count in threads:
            r = ratio(run, count)
            if r is None:
                continue
            found = run.latency[count]
            p10 = found["pte_et"].timing.p10_ms / found["pte_fxm"].timing.p10_ms
            target = TARGETS[run.kind]
            mark = "meets" if meets(run, count) else "MISSES"
            lines.append(
                f"{run.name} ({run.kind}, {count} thread{'s' if count > 1 else ''}): "
                f"{r:.2f}x by medians, {p10:.2f}x by p10; {mark} its target {target}x"
            )
    return lines


def profiles(runs: list[ModelRun], profile_runs: int) -> str:
    """Each profile taken, both programs side by side, with its model, threads and verdict."""
    sections = []
    for run in runs:
        for count, found in run.profiles.items():
            fxm, own = (found[name] for name in PROFILED)
            r = ratio(run, count)
            lines = [
                f"{run.name}, {count} thread{'s' if count > 1 else ''} ({r:.2f}x by medians, "
                f"target {TARGETS[run.kind]}x): per op kind, calls and median us per run over "
                f"{profile_runs} ETDump runs",
                "",
                op_profile.side_by_side(fxm, own, ("fxmobile", "own")),
            ]
            for name, label in zip(PROFILED, ("fxmobile's", "ExecuTorch's own"), strict=True):
                if not op_profile.has_operator_events(found[name]):
                    lines.append(
                        f"{label} program's ETDump holds no XNNPACK operator events (a runtime "
                        f"built without XNNPACK's operator profiling): spans and portable ops only"
                    )
            sections.append("\n".join(lines))
    return "\n\n".join(sections)


def to_json(runs: list[ModelRun]) -> list[dict[str, Any]]:
    """Every figure of every model, as ``--json`` writes them."""
    return [
        {
            "model": run.name,
            "kind": run.kind,
            "target": TARGETS[run.kind],
            "errors": run.errors,
            "relative_error": run.relative_error,
            "programs": {
                name: {
                    "delegate_calls": p.delegate_calls,
                    "portable_ops": p.portable_ops,
                    "seconds": p.seconds,
                    "nbytes": p.nbytes,
                }
                for name, p in run.programs.items()
            },
            "latency": {
                count: {name: latency.to_dict() for name, latency in found.items()}
                for count, found in run.latency.items()
            },
            "own_over_fxmobile": {count: ratio(run, count) for count in run.latency},
            "profiles": {
                count: {
                    name: {kind: dataclasses.asdict(op) for kind, op in profile.items()}
                    for name, profile in found.items()
                }
                for count, found in run.profiles.items()
            },
        }
        for run in runs
    ]


def flow_seconds(runs: list[ModelRun], fmt: str = "github") -> str:
    """The seconds each flow took to make its program, and the programs' sizes."""
    rows = []
    for run in runs:
        own, ours = run.programs.get("pte_et"), run.programs.get("pte_fxm")
        rows.append(
            [
                run.name,
                f"{ours.seconds:.1f}" if ours else "-",
                f"{own.seconds:.1f}" if own else "-",
                f"{ours.seconds / own.seconds:.2f}" if ours and own else "-",
                f"{ours.nbytes / 2**20:.1f}" if ours else "-",
                f"{own.nbytes / 2**20:.1f}" if own else "-",
            ]
        )
    headers = [
        "model",
        "fxmobile.optimize s (checks included)",
        "own flow s",
        "ratio",
        "fxmobile MiB",
        "own MiB",
    ]
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def write_json(path: Path, rounds: int, threads: list[int], runs: list[ModelRun]) -> None:
    """Every figure of ``runs`` into ``path`` (``--json``)."""
    found = {"rounds": rounds, "threads": threads, "models": to_json(runs)}
    path.write_text(json.dumps(found, indent=1))


def main() -> None:
    """Bench every model at every thread count; print the tables, optionally write the docs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=[*CNNS, *TRANSFORMERS], metavar="MODEL")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (default 30)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile both programs per op at every thread count, not only where fxmobile's "
        "misses its target",
    )
    parser.add_argument(
        "--profile-runs", type=int, default=10, help="ETDump runs per profile (default 10)"
    )
    parser.add_argument("--json", type=Path, help="also write every figure here, as JSON")
    figures.add_argument(parser)
    args = parser.parse_args()
    if args.profile_runs < 1:
        parser.error(f"--profile-runs {args.profile_runs}: profile at least one run")
    missing = ecosystem.missing_packages(entry(spec) for spec in args.models)
    if missing:
        parser.error(f"the ecosystem models need {', '.join(missing)}: {ecosystem.INSTALL}")
    load_before, _ = figures.load()
    children: dict[int, RuntimeProcess] = {}
    runs: list[ModelRun] = []
    with contextlib.ExitStack() as stack:
        if installed(REFERENCE_RUNTIME):
            for count in args.threads:
                children[count] = stack.enter_context(RuntimeProcess(REFERENCE_RUNTIME, count))
        else:
            print(f"ptl_212 left out: torch {REFERENCE_RUNTIME} is not installed", file=sys.stderr)
        for spec in args.models:
            start = time.perf_counter()
            print(f"{spec} ...", file=sys.stderr, flush=True)
            try:
                run = bench(
                    spec, args.threads, children, args.rounds, args.profile_runs, args.profile
                )
            except Exception as exc:  # a model that cannot be built: the others still run
                run = ModelRun(entry(spec).key, kind_of(entry(spec)))
                run.errors["model"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            runs.append(run)
            for name, error in run.errors.items():
                print(f"  {spec}: {name} failed: {error}", file=sys.stderr)
            print(f"{spec} done in {time.perf_counter() - start:.0f} s", file=sys.stderr)
            if args.json:  # after each model: a run cut short keeps what it measured
                write_json(args.json, args.rounds, args.threads, runs)
    for count in args.threads:
        print(f"\n{count} thread(s), median ms [10th percentile], {args.rounds} rounds\n")
        print(table(runs, count, "simple"))
    print()
    print("\n".join(verdicts(runs, args.threads)))
    print()
    print(flow_seconds(runs, "simple"))
    ratios = [r for run in runs for c in args.threads if (r := ratio(run, c))]
    if ratios:
        print(f"\nmedian own / fxmobile: {statistics.median(ratios):.2f}x over {len(ratios)} runs")
    if any(run.profiles for run in runs):
        print(f"\n{profiles(runs, args.profile_runs)}")
    if args.write_docs:
        run_info = None
        for count in args.threads:
            run_info = figures.finish(
                runtime=f"ExecuTorch 1.5.1 and torch {torch.__version__.split('+')[0]} here, "
                f"torch {REFERENCE_RUNTIME} for the .ptl",
                kernels="XNNPACK (both programs and the .ptl), ATen (eager), MLAS (ORT)",
                threads=count,
                load_before=load_before,
            )
            if count in THREAD_FIGURES:
                figures.write(THREAD_FIGURES[count], table(runs, count), run_info)
        if run_info is not None:
            figures.write(FLOW_FIGURES, flow_seconds(runs), run_info)


if __name__ == "__main__":
    main()
