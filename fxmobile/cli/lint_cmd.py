"""``fxmobile lint FILE``: ``generate_mobile_module_lints`` of a saved model; exit 1 if any."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fxmobile.cli.common import Console, table
from fxmobile.cli.script_files import load_script_module
from fxmobile.script.lints import generate_mobile_module_lints


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``lint``'s arguments: the file and the output format."""
    parser.add_argument("file", type=Path, metavar="FILE", help="a saved TorchScript file")
    parser.add_argument(
        "--format", choices=("table", "markdown", "json"), default="table", help="default table"
    )


def run(args: argparse.Namespace) -> int:
    """Print the lints of ``args.file``; 1 when there are any."""
    console = Console(args.format)
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
