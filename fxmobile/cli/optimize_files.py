"""After ``optimize``: write the file, check it against eager, time it, check it on runtimes.

- ``write_lite``: a ``.ptl``, with the example inputs' shapes bundled (``fxmobile.cli.bundled``)
  unless ``--no-bundled-inputs`` (the report's lints are taken again, so ``BUNDLED_INPUT`` goes),
  loaded back in the lite interpreter and compared with eager; with ``--latency``, eager, the
  file's TorchScript and its lite interpreter timed in a clean child (``fxmobile.cli.latency``);
  with ``--runtime``, the file on the reference runtimes next to upstream's
  ``optimize_for_mobile`` (``against_upstream``).
- ``write_program``: a ``.pte``, loaded back in ExecuTorch's runtime and compared with eager;
  with ``--latency``, eager and the program timed in a clean child.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from typing import Any

import torch

from fxmobile.api import MobileResult, ProgramResult
from fxmobile.cli.bundled import bundle_example_shapes, has_bundled_inputs
from fxmobile.cli.common import CliError
from fxmobile.cli.latency import CleanChild, InChild, busy, measure, program_kernels
from fxmobile.cli.models import LoadedModel
from fxmobile.cli.optimize_output import Outcome
from fxmobile.cli.script_files import load_lite
from fxmobile.executorch.runtime import ProgramRunner
from fxmobile.progress import phase
from fxmobile.runtime.against_upstream import against_upstream
from fxmobile.runtime.check import here_kernels, runtime_versions
from fxmobile.runtime.process import LoadedFile
from fxmobile.script.lints import generate_mobile_module_lints
from fxmobile.verify import compare_outputs, run_model


def write_lite(
    outcome: Outcome, result: MobileResult, loaded: LoadedModel, args: argparse.Namespace
) -> None:
    """Bundle the inputs' shapes, write the .ptl, check it, time it or check it on runtimes."""
    if has_bundled_inputs(result.module):  # a TorchScript SPEC's, which optimize keeps
        outcome.bundled_note = "the model's own, kept"
    elif not args.bundled_inputs:
        outcome.bundled_note = "none (--no-bundled-inputs)"
    elif loaded.inputs is None:
        outcome.bundled_note = "none: no example inputs (pass --input-shape)"
    else:
        outcome.bundled = bundle_example_shapes(result.module, loaded.inputs)
        result.report.lints = generate_mobile_module_lints(result.module)
    with phase("writing the file"):
        result.save(args.output)
    if loaded.inputs is None:
        outcome.file_skipped = "no example inputs; pass --input-shape to check the file"
    elif result.report.numerics is None:
        outcome.file_skipped = "the optimized module does not run here (see the notes above)"
    else:
        with phase("checking the file against eager"):
            expected = run_model(loaded.model, loaded.inputs)
            actual = run_model(load_lite(args.output), loaded.inputs)
        outcome.file_checks = compare_outputs(expected, actual, args.tolerance)
    if args.runtime:
        _on_runtimes(outcome, loaded, args)
    elif args.latency and result.report.numerics is None:
        outcome.latency_skipped = "the optimized module does not run here (see the notes above)"
    elif args.latency:
        kernels = here_kernels()
        _time_in_child(
            outcome,
            loaded,
            args,
            lambda child: {
                "optimized TorchScript": child.file(args.output, "script"),
                "lite interpreter": child.file(args.output, "lite"),
            },
            kernels,
        )


def write_program(
    outcome: Outcome, result: ProgramResult, loaded: LoadedModel, args: argparse.Namespace
) -> None:
    """Write the .pte, load it back in ExecuTorch's runtime and check it, time it."""
    assert loaded.inputs is not None  # _check_program_arguments
    outcome.file_label = "ExecuTorch program"
    with phase("writing the file"):
        result.save(args.output)
    if result.report.numerics is None:
        outcome.file_skipped = "not checked (--check off)"
    else:
        out_spec = getattr(result.runner, "out_spec", None)
        with phase("checking the file against eager"):
            program = ProgramRunner(str(args.output), out_spec)
            expected = run_model(loaded.model, loaded.inputs)
            actual = run_model(program, loaded.inputs)
        outcome.file_checks = compare_outputs(expected, actual, args.tolerance)
    if args.latency:
        _time_in_child(
            outcome,
            loaded,
            args,
            lambda child: {"ExecuTorch program": child.program(args.output)},
            program_kernels(),
        )


def _time_in_child(
    outcome: Outcome,
    loaded: LoadedModel,
    args: argparse.Namespace,
    load: Callable[[CleanChild], dict[str, LoadedFile]],
    kernels: str,
) -> None:
    """The reference model and what ``load`` loads into a clean child (running on
    ``kernels``), timed there; the report's ``latency`` gets the timings."""
    assert loaded.inputs is not None
    inputs = loaded.inputs
    scripted = isinstance(loaded.model, torch.jit.ScriptModule)
    with CleanChild(args.threads) as child:
        reference = child.eager(args.spec, args.input_shape, loaded.model)
        candidates = {
            outcome.reference: InChild(reference, inputs, "TorchScript" if scripted else "ATen"),
            **{name: InChild(file, inputs, kernels) for name, file in load(child).items()},
        }
        outcome.timed = measure(child, candidates, args.rounds)
    outcome.warnings += outcome.timed.warnings
    outcome.result.report.latency = outcome.timed.timings()


def _on_runtimes(outcome: Outcome, loaded: LoadedModel, args: argparse.Namespace) -> None:
    """The saved file on the reference runtimes, against eager and upstream's file made there;
    with --latency, everything timed interleaved across the processes, the file here in a clean
    child."""
    if loaded.inputs is None:
        raise CliError(f"--runtime needs example inputs; pass --input-shape for {args.spec}")
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        child_or_none = CleanChild(args.threads) if args.latency else contextlib.nullcontext()
        with child_or_none as child:
            here: dict[str, Any] = {}
            if child is not None:
                lite = child.file(args.output, "lite")
                here["fxmobile file, clean child"] = InChild(lite, loaded.inputs, here_kernels())
            with phase("checking on the reference runtimes"):
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
    outcome.threads = args.threads
    if outcome.runtimes.latency is not None:
        outcome.warnings += busy(outcome.runtimes.latency)


def collect_failures(outcome: Outcome) -> None:
    """Every check that failed, one line each, in ``outcome.failures``."""
    checks = [("optimized module", outcome.result.report.numerics or [])]
    checks.append((f"{outcome.file_label} file", outcome.file_checks or []))
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
