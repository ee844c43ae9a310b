"""The ``fxmobile`` command line: ``optimize``, ``lint``, ``inspect``, ``check`` and ``passes``.

``main`` returns the exit status and never raises ``SystemExit``: 0 on success; 1 when the
command line does not parse or fxmobile refuses the input (one line on stderr,
``fxmobile: error: ...``, naming the culprit, without a traceback), when ``lint`` finds lints
and when a numerical check fails; 130 when interrupted; 141 (128 + SIGPIPE, as a tool killed by
it) when stdout closes early (``fxmobile passes | head``), quietly.

Results go to stdout, status lines and warnings to stderr; on a terminal, stderr also shows
each phase as it runs (``fxmobile.cli.status``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Protocol

from fxmobile.cli import check_cmd, inspect_cmd, lint_cmd, optimize_cmd, passes_cmd
from fxmobile.cli.common import Console, Parser, quiet_deprecations
from fxmobile.cli.status import StatusLine
from fxmobile.errors import FxMobileError
from fxmobile.progress import listening

__all__ = ["build_parser", "main"]

_DESCRIPTION = (
    "Optimize PyTorch models for mobile runtimes (PyTorch Mobile's lite interpreter on XNNPACK, "
    "Vulkan or Metal, and ExecuTorch's XNNPACK delegate) and look inside the files they run."
)
_EPILOG = """\
Exit status: 0 on success; 1 on a bad argument or input (one line, fxmobile: error: ...), when
lint finds lints and when a numerical check fails. Results go to stdout, status to stderr.

The model zoo regression run is not a command of fxmobile: run it with
python -m model_zoo_checks (installed with fxmobile; needs the zoo extra, fxmobile[zoo]).
"""
_BROKEN_PIPE = 128 + 13  # SIGPIPE: what a shell reports for a tool stopped by a closed pipe
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

The output's suffix picks the format: .ptl writes a lite-interpreter file (PyTorch Mobile),
.pte an ExecuTorch program for its XNNPACK delegate (as --target-runtime executorch; needs
fxmobile[executorch] and example inputs). Without example inputs the model is optimized
without a numerical check. The file written is loaded back (lite interpreter, or ExecuTorch's
runtime) and its outputs compared with eager; exit status 1 if any output is off by more than
--tolerance of the eager output's largest magnitude. A .ptl file carries its example inputs'
shapes as bundled inputs (random at run time), so fxmobile check needs no --input-shape.

--latency times eager and the file in a clean child process (OMP_WAIT_POLICY=PASSIVE unless
set, --threads threads), candidates interleaved, and warns when the spread of the times shows
the machine was busy.

examples:
  fxmobile optimize torchvision:mobilenet_v2 -o build/mobilenet_v2.ptl --latency
  fxmobile optimize torchvision:mobilenet_v2 -o build/mobilenet_v2.pte --latency
"""


class Command(Protocol):
    """A subcommand module: adds its arguments, runs on the parsed ones."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def build_parser() -> argparse.ArgumentParser:
    """The ``fxmobile`` parser, one subparser per command, each holding its command's ``run``."""
    parser = Parser(
        prog="fxmobile",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add(
        commands,
        "optimize",
        optimize_cmd,
        "optimize a model and write a lite-interpreter file (.ptl) or ExecuTorch program (.pte)",
        _OPTIMIZE_EPILOG,
    )
    _add(
        commands,
        "lint",
        lint_cmd,
        "list what to fix before shipping a TorchScript file (exit 1 if any)",
    )
    _add(
        commands,
        "inspect",
        inspect_cmd,
        "show what a saved file holds: ops, packed contexts and markers of a .ptl; delegates, "
        "kernel calls and size of a .pte",
    )
    _add(
        commands,
        "check",
        check_cmd,
        "run a saved file where apps run it: a .ptl in the real mobile runtimes, a .pte in "
        "ExecuTorch's runtime; compare outputs, and time a .pte",
        check_cmd.EPILOG,
    )
    _add(commands, "passes", passes_cmd, "list the passes optimize runs for a backend, in order")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names (default ``sys.argv[1:]``); the exit status."""
    status = StatusLine.for_stream(sys.stderr)
    console = Console(status=status)
    try:
        with contextlib.ExitStack() as stack:
            if status is not None:
                stack.callback(status.close)
                stack.enter_context(listening(status.event))
            code = _run(argv, console)
            sys.stdout.flush()  # a closed pipe shows here, not at exit
            return code
    except BrokenPipeError:
        _silence_stdout()
        return _BROKEN_PIPE


def _run(argv: Sequence[str] | None, console: Console) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help and --version print and exit 0
        return exit_.code if isinstance(exit_.code, int) else 1
    except FxMobileError as exc:  # a usage error (Parser)
        console.status(f"fxmobile: error: {exc}")
        return 1
    args.console = console
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        with quiet_deprecations():
            return run(args)
    except FxMobileError as exc:
        console.status(f"fxmobile: error: {exc}")
        return 1
    except KeyboardInterrupt:
        console.status("fxmobile: interrupted")
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit finds no closed pipe."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _add(
    commands: argparse._SubParsersAction[Parser],
    name: str,
    command: Command,
    summary: str,
    epilog: str | None = None,
) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
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
