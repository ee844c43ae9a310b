"""``fxmobile optimize SPEC -o OUT``: optimize, save a lite-interpreter file, check it, time it.

The steps: load the model SPEC names (``fxmobile.cli.models``), ``fxmobile.optimize`` it for the
backend, print the report, save the lite-interpreter file, load it back with the lite
interpreter and compare its outputs with eager on the same inputs. With ``--latency``, eager, the
optimized TorchScript module and the lite-interpreter module are timed interleaved.

The lite check runs whenever the report's own check ran: ``optimize`` leaves
``report.numerics`` empty exactly when the optimized module cannot run on this machine (a Vulkan
module that moves tensors to the GPU) or has no forward, and the report's notes say which.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fxmobile.api import optimize
from fxmobile.cli.common import CliError, Console, blocklist_member, input_shape, positive_int
from fxmobile.cli.models import SPEC_FORMS, LoadedModel, load_model
from fxmobile.cli.optimize_output import Outcome, render, render_report
from fxmobile.cli.script_files import load_lite
from fxmobile.errors import NumericalMismatchError
from fxmobile.options import DEFAULT_TOLERANCE, Backend, Check
from fxmobile.runtime.against_upstream import against_upstream
from fxmobile.runtime.check import here_kernels, runtime_versions
from fxmobile.runtime.install import RUNTIMES
from fxmobile.runtime.latency import Here
from fxmobile.timing import interleaved_medians
from fxmobile.verify import compare_outputs, run_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``optimize``'s arguments: the SPEC, the output file, and how to optimize, check and time."""
    parser.add_argument("spec", metavar="SPEC", help=SPEC_FORMS)
    parser.add_argument(
        "-o", "--output", required=True, type=Path, help="the lite-interpreter file to write"
    )
    parser.add_argument(
        "--backend",
        type=str.lower,
        choices=[b.value for b in Backend],
        default=Backend.CPU.value,
        help="the mobile runtime to optimize for (default cpu: XNNPACK prepacked ops)",
    )
    parser.add_argument(
        "--input-shape",
        type=input_shape,
        action="append",
        metavar="SHAPE",
        help="shape of a random example input, e.g. 1,3,224,224; repeat for several inputs",
    )
    parser.add_argument(
        "--blocklist",
        type=blocklist_member,
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help="optimizations to switch off, by MobileOptimizerType name, e.g. remove_dropout",
    )
    parser.add_argument(
        "--preserve",
        nargs="+",
        action="extend",
        default=[],
        metavar="METHOD",
        help="methods to keep besides forward",
    )
    parser.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run activations channels-last (default: on for cpu, off for vulkan and metal)",
    )
    parser.add_argument(
        "--weights",
        help="torchvision weights, e.g. DEFAULT or IMAGENET1K_V1 (downloads them); "
        "default: random init",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="max error relative to the eager output's largest magnitude (default %(default)g)",
    )
    parser.add_argument(
        "--check",
        type=str.lower,
        choices=[c.value for c in Check],
        default=Check.RAISE.value,
        help="when an output differs from eager beyond --tolerance: raise (exit 1, no file "
        "written; the default), warn (write the file anyway) or off (do not run the model)",
    )
    parser.add_argument(
        "--format",
        choices=("table", "markdown", "json"),
        default="table",
        help="how to print the report (default table; json prints one JSON document)",
    )
    parser.add_argument(
        "--target-runtime",
        choices=list(RUNTIMES),
        metavar="VERSION",
        help="write the bytecode this reference runtime reads (backported when needed; refused, "
        "naming the operator, when an operator is newer than it): " + ", ".join(RUNTIMES),
    )
    parser.add_argument(
        "--runtime",
        choices=[*RUNTIMES, "all"],
        help="also load and check the saved file in this reference runtime (make runtimes), "
        "against eager and against upstream's optimize_for_mobile made there; with --latency, "
        "time them there, interleaved",
    )
    parser.add_argument(
        "--latency", action="store_true", help="time eager, optimized and lite-interpreter runs"
    )
    parser.add_argument(
        "--threads", type=positive_int, default=2, help="torch threads for --latency (default 2)"
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=20, help="timed rounds for --latency (default 20)"
    )


def run(args: argparse.Namespace) -> int:
    """Optimize, save, check and optionally time ``args.spec``; 0, or ``NumericalMismatchError``.

    A failed check raises unless ``--check warn``, after the file is written so it can be looked at.
    """
    console = Console(args.format)
    if args.output.is_dir():
        raise CliError(f"-o {args.output} is a directory; name the file to write, e.g. model.ptl")
    loaded = load_model(args.spec, args.input_shape, args.weights)
    for note in loaded.notes:
        console.progress(note)
    if args.latency and loaded.inputs is None:
        raise CliError(f"--latency needs example inputs; pass --input-shape for {args.spec}")
    _check_preserved(loaded.model, args.preserve)
    shapes = "no example inputs" if loaded.inputs is None else _shapes(loaded.inputs)
    console.progress(f"optimizing {args.spec} for {args.backend} ({shapes})")

    start = time.perf_counter()
    try:
        result = optimize(
            loaded.model,
            args.blocklist,
            args.preserve or None,
            Backend(args.backend),
            example_inputs=loaded.inputs,
            channels_last=args.channels_last,
            tolerance=args.tolerance,
            check=args.check,
            target_runtime=args.target_runtime,
        )
    except NumericalMismatchError as exc:
        console.result(render_report(exc.report, args.format))
        raise
    seconds = time.perf_counter() - start
    scripted = isinstance(loaded.model, torch.jit.ScriptModule)
    reference = "original TorchScript" if scripted else "eager"
    outcome = Outcome(result, reference, args.output, seconds, list(loaded.notes))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    result.save(args.output)
    lite = load_lite(args.output)
    _check_lite(outcome, loaded, lite, args.tolerance)
    if args.latency and not args.runtime:
        _time(outcome, loaded, lite, args.threads, args.rounds)
    if args.runtime:
        _on_runtimes(outcome, loaded, lite, args)
    _collect_failures(outcome)

    console.result(render(outcome, args.format))
    if outcome.failures and Check(args.check) is Check.WARN:
        for failure in outcome.failures:
            console.warn(f"numerics check failed: {failure} (--check warn: kept {args.output})")
    elif outcome.failures:
        failures = "; ".join(outcome.failures)
        raise NumericalMismatchError(
            f"numerics check failed: {failures}; {args.output} was written for a look",
            result.report,
        )
    return 0


def _check_preserved(model: nn.Module, names: list[str]) -> None:
    """Every --preserve name is on the model, and exported when the model is still eager."""
    for name in names:
        if not hasattr(model, name):
            raise CliError(f"--preserve {name}: {type(model).__name__} has no method {name!r}")
        if isinstance(model, torch.jit.ScriptModule):
            continue
        method = getattr(type(model), name, None)
        modifier = torch._jit_internal.get_torchscript_modifier(method)
        if callable(method) and modifier is not torch._jit_internal.FunctionModifiers.EXPORT:
            raise CliError(
                f"--preserve {name}: {type(model).__name__}.{name} is not exported to "
                f"TorchScript; decorate it with @torch.jit.export"
            )


def _check_lite(outcome: Outcome, loaded: LoadedModel, lite: Any, tolerance: float) -> None:
    if loaded.inputs is None:
        outcome.lite_skipped = "no example inputs; pass --input-shape to check the file"
    elif outcome.result.report.numerics is None:
        outcome.lite_skipped = "the optimized module does not run here (see the notes above)"
    else:
        expected = run_model(loaded.model, loaded.inputs)
        outcome.lite_checks = compare_outputs(expected, run_model(lite, loaded.inputs), tolerance)


def _time(outcome: Outcome, loaded: LoadedModel, lite: Any, threads: int, rounds: int) -> None:
    if outcome.result.report.numerics is None:
        outcome.latency_skipped = "the optimized module does not run here (see the notes above)"
        return
    inputs = loaded.inputs or ()
    optimized = outcome.result.module
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    outcome.threads = threads
    outcome.kernels = here_kernels()
    try:
        outcome.latency = interleaved_medians(
            {
                outcome.reference: lambda: loaded.model(*inputs),
                "optimized TorchScript": lambda: optimized(*inputs),
                "lite interpreter": lambda: lite(*inputs),
            },
            rounds=rounds,
        )
    finally:
        torch.set_num_threads(previous)


def _on_runtimes(
    outcome: Outcome, loaded: LoadedModel, lite: Any, args: argparse.Namespace
) -> None:
    """The saved file on the reference runtimes, against eager and upstream's file made there;
    with --latency, everything timed interleaved across the processes."""
    if loaded.inputs is None:
        raise CliError(f"--runtime needs example inputs; pass --input-shape for {args.spec}")
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    here = {"fxmobile file here": Here(lite, loaded.inputs, here_kernels())}
    try:
        outcome.runtimes = against_upstream(
            loaded.model,
            args.output,
            loaded.inputs,
            runtime_versions(args.runtime),
            latency=args.latency,
            rounds=args.rounds,
            threads=args.threads,
            tolerance=args.tolerance,
            here=here,
        )
    finally:
        torch.set_num_threads(previous)


def _collect_failures(outcome: Outcome) -> None:
    checks = [("optimized TorchScript", outcome.result.report.numerics or [])]
    checks.append(("lite-interpreter file", outcome.lite_checks or []))
    for what, results in checks:
        for c in results:
            if not c.passed:
                outcome.failures.append(
                    f"{what} {c.path} is off by {c.relative_error:.3g} of the {outcome.reference} "
                    f"output's scale (tolerance {c.tolerance:g})"
                )
    if outcome.runtimes is not None and not outcome.runtimes.passed:
        failed = [c.runtime for c in outcome.runtimes.checks if not c.passed]
        outcome.failures.append(f"the file does not load or match on torch {', '.join(failed)}")


def _shapes(inputs: tuple[torch.Tensor, ...]) -> str:
    return "input " + ", ".join("x".join(str(d) for d in x.shape) for x in inputs)
