"""The ``fxmobile`` command line: ``optimize``, ``lint``, ``inspect``, ``check`` and ``passes``.

``main`` returns the exit status and never raises ``SystemExit``: 0 on success, 1 when fxmobile
refuses the input (the message, without a traceback, on stderr), when ``lint`` finds lints or
when the numerical check fails, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Protocol

from fxmobile.cli import check_cmd, inspect_cmd, lint_cmd, optimize_cmd, passes_cmd
from fxmobile.cli.common import quiet_deprecations
from fxmobile.errors import FxMobileError

__all__ = ["build_parser", "main"]

_DESCRIPTION = (
    "Optimize PyTorch models for mobile runtimes (XNNPACK CPU, Vulkan, Metal) and look inside "
    "the TorchScript files they run."
)
_OPTIMIZE_EPILOG = """\
SPEC is one of:
  torchvision:NAME        torchvision.models.get_model(NAME); random weights unless --weights,
                          with randomized BatchNorm statistics; default input 1,3,224,224
                          (inception_v3: 1,3,299,299; video models: 16 frames of 112x112,
                          or 224x224 for mvit and s3d)
  path/to/file.py:NAME    NAME() from that file, called without arguments: an nn.Module
                          subclass or a function returning a module. Inputs: --input-shape, or
                          else the file's example_inputs() function if it defines one
  path/to/model.pt        a saved TorchScript file (torch.jit.save or fxmobile output)

Without example inputs the model is optimized without a numerical check. The file written is
loaded back with the lite interpreter and its outputs compared with eager; exit status 1 if
any output is off by more than --tolerance of the eager output's largest magnitude.

example:
  fxmobile optimize torchvision:mobilenet_v2 -o build/mobilenet_v2.ptl --latency
"""


class Command(Protocol):
    """A subcommand module: adds its arguments, runs on the parsed ones."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def build_parser() -> argparse.ArgumentParser:
    """The ``fxmobile`` parser, one subparser per command, each holding its command's ``run``."""
    parser = argparse.ArgumentParser(prog="fxmobile", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add(
        commands,
        "optimize",
        optimize_cmd,
        "optimize a model and write a lite-interpreter file",
        _OPTIMIZE_EPILOG,
    )
    _add(
        commands, "lint", lint_cmd, "list what to fix before shipping a saved model (exit 1 if any)"
    )
    _add(commands, "inspect", inspect_cmd, "show ops, packed contexts and markers of a saved model")
    _add(
        commands,
        "check",
        check_cmd,
        "load and run a lite-interpreter file in the real mobile runtimes and compare outputs",
        check_cmd.EPILOG,
    )
    _add(commands, "passes", passes_cmd, "list the passes optimize runs for a backend, in order")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names (default ``sys.argv[1:]``); the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version, usage errors
        return exit_.code if isinstance(exit_.code, int) else 2
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        with quiet_deprecations():
            return run(args)
    except FxMobileError as exc:
        print(f"fxmobile: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fxmobile: interrupted", file=sys.stderr)
        return 130


def _add(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    command: Command,
    summary: str,
    epilog: str | None = None,
) -> None:
    parser = commands.add_parser(
        name,
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_arguments(parser)
    parser.set_defaults(run=command.run)


def _version() -> str:
    try:
        return metadata.version("fxmobile")
    except metadata.PackageNotFoundError:
        return "unknown"
