"""``fxmobile check FILE --runtime VERSION|all``: does the file load and compute the same on
the real runtimes?

Loads a lite-interpreter file in each reference runtime (``make runtimes`` installs them; each
runs in its own process), runs it on the same random inputs, and compares with the file run
here by fxmobile's operator library. Exit status 1 when a runtime does not load the file, fails
to run it, or differs by more than --tolerance of the output's largest magnitude.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fxmobile.cli.common import TABLE_FORMATS, CliError, Console, input_shape, positive_int
from fxmobile.cli.models import SEED, random_inputs
from fxmobile.cli.script_files import has_bytecode
from fxmobile.options import DEFAULT_TOLERANCE
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
example:
  fxmobile optimize torchvision:mobilenet_v2 -o mobilenet_v2.ptl
  fxmobile check mobilenet_v2.ptl --runtime all --input-shape 1,3,224,224
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``check``'s arguments: the file, the runtimes, the inputs, the tolerance, threads, format."""
    parser.add_argument("file", type=Path, metavar="FILE", help="a lite-interpreter file (.ptl)")
    parser.add_argument(
        "--runtime",
        required=True,
        choices=(*RUNTIMES, "all"),
        help="the reference runtime(s) to check on (make runtimes installs them)",
    )
    parser.add_argument(
        "--input-shape",
        type=input_shape,
        action="append",
        metavar="SHAPE",
        help="shape of one input, e.g. 1,3,224,224 (repeat for several inputs); inputs are "
        f"torch.randn under seed {SEED}. Default: the file's first bundled input",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"relative to the output's largest magnitude (default {DEFAULT_TOLERANCE:g})",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=2, help="threads per runtime (default 2)"
    )
    parser.add_argument(
        "--format", choices=("table", "markdown", "json"), default="table", help="default table"
    )


def run(args: argparse.Namespace) -> int:
    """Check ``args.file`` on each runtime asked for; 1 when one fails to load, run or agree."""
    path: Path = args.file
    if not path.is_file():
        raise CliError(f"{path}: no such file")
    if not has_bytecode(path):
        raise CliError(
            f"{path} has no lite-interpreter bytecode, which is what mobile runtimes load; "
            f"save it with fxmobile optimize -o out.ptl or _save_for_lite_interpreter"
        )
    data = read_bytes(path)
    inputs, described = _inputs(args.input_shape, data, path)
    found = check_on_runtimes(
        data,
        inputs,
        runtime_versions(args.runtime),
        tolerance=args.tolerance,
        threads=args.threads,
    )
    console = Console(args.format)
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
        f"({here_kernels()}), tolerance {args.tolerance:g}"
    )
    return f"{head}\n\n{checks_table(found, TABLE_FORMATS[args.format])}"
