"""``fxmobile lint FILE``: ``generate_mobile_module_lints`` of a saved model; exit 1 if any.

The lints are upstream's and fxmobile's for TorchScript (``BUNDLED_INPUT``, ``NOT_PREPACKED``...),
which a ``.pte`` has none of: an ExecuTorch program is refused, pointing at ``fxmobile inspect``,
which lists what it runs outside its delegates.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fxmobile.cli.common import CliError, add_format, table
from fxmobile.cli.script_files import load_script_module
from fxmobile.executorch.program_file import is_program
from fxmobile.script.lints import generate_mobile_module_lints


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``lint``'s arguments: the file and the output format."""
    parser.add_argument(
        "file", type=Path, metavar="FILE", help="a saved TorchScript file (.pt, .ptl)"
    )
    add_format(parser)


def run(args: argparse.Namespace) -> int:
    """Print the lints of ``args.file``; 1 when there are any."""
    console = args.console
    if args.file.is_file() and is_program(args.file):
        raise CliError(
            f"{args.file} is an ExecuTorch program; the lints are for TorchScript files. "
            f"fxmobile inspect {args.file} lists what it runs outside its delegates"
        )
    lints = generate_mobile_module_lints(load_script_module(args.file))
    if args.format == "json":
        console.result(json.dumps({"file": str(args.file), "lints": lints}, indent=2))
    elif lints:
        rows: list[list[object]] = [[lint["name"], lint["message"]] for lint in lints]
        console.result(table(rows, ["lint", "message"], args.format, [None, 90], numbers=False))
        console.result(f"\n{len(lints)} lint(s) in {args.file}")
    else:
        console.result(f"no lints in {args.file}")
    return 1 if lints else 0
