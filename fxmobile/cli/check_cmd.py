"""``fxmobile check FILE``: does the file load and compute the same where apps run it?

A lite-interpreter file (``--runtime VERSION|all``): loaded in each reference runtime (``make
runtimes`` installs them; each runs in its own process), run on the same inputs (random of each
``--input-shape``, or the file's first bundled input), and compared with the file run here by
fxmobile's operator library. Exit status 1 when a runtime does not load the file, fails to run
it, or differs by more than --tolerance of the output's largest magnitude.

An ExecuTorch program (``.pte``, recognised by its bytes): run and timed in ExecuTorch's runtime
(``fxmobile.cli.check_program``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fxmobile.cli import check_program
from fxmobile.cli.common import TABLE_FORMATS, CliError, add_format, input_shape, positive_int
from fxmobile.cli.models import SEED, SPEC_FORMS, random_inputs
from fxmobile.cli.script_files import has_bytecode
from fxmobile.executorch.program_file import is_program
from fxmobile.options import describe_tolerance
from fxmobile.progress import phase
from fxmobile.runtime.check import (
    RuntimeCheck,
    bundled_inputs,
    check_on_runtimes,
    checks_table,
    here_kernels,
    runtime_versions,
)
from fxmobile.runtime.compat import bytecode_version, read_bytes
from fxmobile.runtime.install import RUNTIMES

EPILOG = """\
A .ptl runs in the reference runtimes --runtime names, on the file's bundled inputs (fxmobile
optimize bundles its example inputs' shapes) or on --input-shape. A .pte runs in ExecuTorch's
runtime on inputs of the shapes the program fixes: checked that it runs, is deterministic and
finite, against eager with --model SPEC, and timed (median, p10, p90) in a clean child process.

examples:
  fxmobile optimize torchvision:mobilenet_v2 -o mobilenet_v2.ptl
  fxmobile check mobilenet_v2.ptl --runtime all
  fxmobile optimize torchvision:mobilenet_v2 -o mobilenet_v2.pte
  fxmobile check mobilenet_v2.pte --model torchvision:mobilenet_v2
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``check``'s arguments: the file, the runtimes, the inputs, the tolerance, threads, format."""
    parser.add_argument(
        "file",
        type=Path,
        metavar="FILE",
        help="a lite-interpreter file (.ptl) or an ExecuTorch program (.pte)",
    )
    parser.add_argument(
        "--runtime",
        choices=(*RUNTIMES, "all"),
        help="the reference runtime(s) to check a .ptl on (make runtimes installs them); "
        "required for a .ptl",
    )
    parser.add_argument(
        "--input-shape",
        type=input_shape,
        action="append",
        metavar="SHAPE",
        help="shape of one input, e.g. 1,3,224,224 (repeat for several inputs); inputs are "
        f"torch.randn under seed {SEED}. Default: a .ptl's first bundled input, a .pte's "
        "input shapes",
    )
    parser.add_argument(
        "--model",
        metavar="SPEC",
        help=f"the model a .pte was made from, to compare with eager: {SPEC_FORMS}",
    )
    parser.add_argument(
        "--weights",
        help="with --model torchvision:NAME: the weights optimize was given (default random)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="relative to eager's largest output magnitude (default: by each output's dtype, as "
        "torch.testing: float32 1e-4, float16 1e-2, bfloat16 5e-2, integers exact)",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=2,
        help="threads per runtime, and for timing a .pte (default 2)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=20,
        help="timed rounds for a .pte (default 20)",
    )
    add_format(parser)


def run(args: argparse.Namespace) -> int:
    """Check ``args.file`` on each runtime asked for; 1 when one fails to load, run or agree."""
    path: Path = args.file
    if not path.is_file():
        raise CliError(f"{path}: no such file")
    if is_program(path):
        return check_program.run(args, path)
    for option in ("model", "weights"):
        if getattr(args, option):
            raise CliError(
                f"--{option} applies to ExecuTorch programs (.pte); {path} is checked against "
                f"itself run here"
            )
    if not args.runtime:
        raise CliError(
            f"name the reference runtimes to check {path} on: --runtime "
            f"{'|'.join(RUNTIMES)}|all (make runtimes installs them)"
        )
    if not has_bytecode(path):
        raise CliError(
            f"{path} has no lite-interpreter bytecode, which is what mobile runtimes load; "
            f"save it with fxmobile optimize -o out.ptl or _save_for_lite_interpreter"
        )
    data = read_bytes(path)
    inputs, described = _inputs(args.input_shape, data, path)
    with phase("checking on the reference runtimes"):
        found = check_on_runtimes(
            data,
            inputs,
            runtime_versions(args.runtime),
            tolerance=args.tolerance,
            threads=args.threads,
        )
    console = args.console
    if args.format == "json":
        document = {
            "file": str(path),
            "bytecode_version": found[0].bytecode_version,
            "inputs": described,
            "reference": f"this process, {here_kernels()}",
            "runtimes": [c.to_dict() for c in found],
        }
        console.result(json.dumps(document, indent=2))
    else:
        console.result(_render(path, found, args, bytecode_version(data), described))
    return 0 if all(c.passed for c in found) else 1


def _inputs(
    shapes: list[tuple[int, ...]] | None, data: bytes, path: Path
) -> tuple[tuple[Any, ...], str]:
    """The inputs to run on, and how they were made (for the output)."""
    if shapes:
        listed = " ".join("x".join(map(str, s)) for s in shapes)
        return random_inputs(shapes), f"{listed} (torch.randn, seed {SEED})"
    bundled = bundled_inputs(data)
    if not bundled:
        raise CliError(
            f"{path} has no bundled inputs; pass the input shape(s), e.g. --input-shape 1,3,224,224"
        )
    return tuple(bundled[0]), "the file's first bundled input"


def _render(
    path: Path, found: list[RuntimeCheck], args: argparse.Namespace, version: int, inputs: str
) -> str:
    head = (
        f"{path}: bytecode {version}; inputs {inputs}; compared with the file run here "
        f"({here_kernels()}), tolerance {describe_tolerance(args.tolerance)}"
    )
    return f"{head}\n\n{checks_table(found, TABLE_FORMATS[args.format])}"
