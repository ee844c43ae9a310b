"""``fxmobile optimize SPEC -o OUT``: optimize, write the file, check it, time it.

The steps: load the model SPEC names (``fxmobile.cli.models``), ``fxmobile.optimize`` it, write
the file, check it and time it (``fxmobile.cli.optimize_files``), print what was found
(``fxmobile.cli.optimize_output``). The output's suffix picks what is written: ``.pte`` an
ExecuTorch program for the XNNPACK delegate (as ``--target-runtime executorch``), any other a
lite-interpreter file for the backend. The file's check runs whenever the report's own check ran:
``optimize`` leaves ``report.numerics`` empty exactly when the optimized module cannot run on
this machine (a Vulkan module that moves tensors to the GPU) or has no forward, and the report's
notes say which.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

from fxmobile.api import EXECUTORCH, ProgramResult, optimize
from fxmobile.cli.common import CliError, add_format, blocklist_member, input_shape, positive_int
from fxmobile.cli.models import SPEC_FORMS, LoadedModel, load_model
from fxmobile.cli.optimize_files import collect_failures, write_lite, write_program
from fxmobile.cli.optimize_output import Outcome, render, render_report
from fxmobile.errors import NumericalMismatchError
from fxmobile.options import Backend, Check
from fxmobile.progress import phase
from fxmobile.runtime.install import RUNTIMES

PROGRAM_SUFFIX = ".pte"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``optimize``'s arguments: the SPEC, the output file, and how to optimize, check and time."""
    parser.add_argument("spec", metavar="SPEC", help=SPEC_FORMS)
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        help="the file to write: model.ptl (lite interpreter) or model.pte (ExecuTorch)",
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
        "--preserved-methods",
        nargs="+",
        action="extend",
        default=[],
        metavar="METHOD",
        help="methods to keep besides forward (exported with @torch.jit.export)",
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
        default=None,
        help="relative to eager's largest output magnitude (default: by each output's dtype, as "
        "torch.testing: float32 1e-4, float16 1e-2, bfloat16 5e-2, integers exact)",
    )
    parser.add_argument(
        "--check",
        type=str.lower,
        choices=[c.value for c in Check],
        default=Check.RAISE.value,
        help="when an output differs from eager beyond --tolerance: raise (exit 1, no file "
        "written; the default), warn (write the file anyway) or off (do not run the model)",
    )
    add_format(parser)
    parser.add_argument(
        "--target-runtime",
        type=str.lower,
        choices=[*RUNTIMES, EXECUTORCH],
        metavar="RUNTIME",
        help="a reference runtime's version, to write the bytecode it reads (backported when "
        "needed; refused, naming the operator, when an operator is newer than it): "
        + ", ".join(RUNTIMES)
        + f"; or {EXECUTORCH}, to write an ExecuTorch program (as -o model.pte does)",
    )
    parser.add_argument(
        "--runtime",
        choices=[*RUNTIMES, "all"],
        help="also load and check the saved .ptl in this reference runtime (make runtimes), "
        "against eager and against upstream's optimize_for_mobile made there; with --latency, "
        "time them there, interleaved",
    )
    parser.add_argument(
        "--bundled-inputs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bundle the example inputs' shapes into the .ptl (random at run time; the "
        "default), so that fxmobile lint is clean and fxmobile check needs no --input-shape",
    )
    parser.add_argument(
        "--latency",
        action="store_true",
        help="time eager and the file (.ptl: its TorchScript and its lite interpreter; .pte: "
        "in ExecuTorch's runtime) in a clean child process",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=2,
        help="threads for --latency and --runtime (default 2)",
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=20, help="timed rounds for --latency (default 20)"
    )


def run(args: argparse.Namespace) -> int:
    """Optimize, save, check and optionally time ``args.spec``; 0, or ``NumericalMismatchError``.

    A failed check raises unless ``--check warn``, after the file is written so it can be looked at.
    """
    console = args.console
    target = _target_runtime(args)
    if args.output.is_dir():
        raise CliError(f"-o {args.output} is a directory; name the file to write, e.g. model.ptl")
    with phase("building the model"):
        loaded = load_model(args.spec, args.input_shape, args.weights)
    for note in loaded.notes:
        console.status(note)
    if args.latency and loaded.inputs is None:
        raise CliError(f"--latency needs example inputs; pass --input-shape for {args.spec}")
    if target == EXECUTORCH:
        _check_program_arguments(loaded, args)
    _check_preserved(loaded.model, args.preserved_methods)
    shapes = "no example inputs" if loaded.inputs is None else _shapes(loaded.inputs)
    making = "an ExecuTorch program" if target == EXECUTORCH else args.backend
    console.status(f"optimizing {args.spec} for {making} ({shapes})")

    start = time.perf_counter()
    try:
        result = optimize(
            loaded.model,
            args.blocklist,
            args.preserved_methods or None,
            Backend(args.backend),
            example_inputs=loaded.inputs,
            channels_last=args.channels_last,
            tolerance=args.tolerance,
            check=args.check,
            target_runtime=target,
        )
    except NumericalMismatchError as exc:
        console.result(render_report(exc.report, args.format))
        raise
    seconds = time.perf_counter() - start
    scripted = isinstance(loaded.model, torch.jit.ScriptModule)
    reference = "original TorchScript" if scripted else "eager"
    outcome = Outcome(result, reference, args.output, seconds, list(loaded.notes))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(result, ProgramResult):
        write_program(outcome, result, loaded, args)
    else:
        write_lite(outcome, result, loaded, args)
    collect_failures(outcome)

    console.result(render(outcome, args.format))
    for warning in outcome.warnings:
        console.warn(warning)
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


def _target_runtime(args: argparse.Namespace) -> str | None:
    """``--target-runtime``, or executorch for a ``.pte`` output; their conflicts refused."""
    program_file = args.output.suffix.lower() == PROGRAM_SUFFIX
    if program_file and args.target_runtime not in (None, EXECUTORCH):
        raise CliError(
            f"-o {args.output} writes an ExecuTorch program, which --target-runtime "
            f"{args.target_runtime} (a lite-interpreter runtime) does not read; name the file "
            f"{args.output.with_suffix('.ptl')}, or drop --target-runtime"
        )
    if args.target_runtime == EXECUTORCH and not program_file:
        raise CliError(
            f"--target-runtime {EXECUTORCH} writes an ExecuTorch program; name the file "
            f"{args.output.with_suffix(PROGRAM_SUFFIX)}"
        )
    return EXECUTORCH if program_file else args.target_runtime


def _check_program_arguments(loaded: LoadedModel, args: argparse.Namespace) -> None:
    """What an ExecuTorch program cannot be made from, said in the command line's terms."""
    if isinstance(loaded.model, torch.jit.ScriptModule):
        raise CliError(
            f"{args.spec} is a TorchScript file; an ExecuTorch program is exported from the "
            f"eager model: pass torchvision:NAME or path/to/file.py:NAME, or write a .ptl"
        )
    if loaded.inputs is None:
        raise CliError(
            f"-o {args.output} needs example inputs (torch.export traces the model with them); "
            f"pass --input-shape for {args.spec}"
        )
    if Backend(args.backend) is not Backend.CPU:
        raise CliError(
            f"-o {args.output} is a program for ExecuTorch's XNNPACK delegate, on the CPU; "
            f"drop --backend {args.backend}, or write a .ptl for {args.backend}"
        )
    for option, given in (
        ("--preserved-methods", args.preserved_methods),
        ("--runtime", args.runtime),
    ):
        if given:
            raise CliError(
                f"{option} applies to lite-interpreter files (.ptl), not to -o {args.output}"
            )


def _check_preserved(model: nn.Module, names: list[str]) -> None:
    """Every --preserved-methods name is on the model, and exported when the model is eager."""
    for name in names:
        if not hasattr(model, name):
            raise CliError(
                f"--preserved-methods {name}: {type(model).__name__} has no method {name!r}"
            )
        if isinstance(model, torch.jit.ScriptModule):
            continue
        method = getattr(type(model), name, None)
        modifier = torch._jit_internal.get_torchscript_modifier(method)
        if callable(method) and modifier is not torch._jit_internal.FunctionModifiers.EXPORT:
            raise CliError(
                f"--preserved-methods {name}: {type(model).__name__}.{name} is not exported to "
                f"TorchScript; decorate it with @torch.jit.export"
            )


def _shapes(inputs: tuple[torch.Tensor, ...]) -> str:
    return "input " + ", ".join("x".join(str(d) for d in x.shape) for x in inputs)
