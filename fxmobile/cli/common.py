"""What every subcommand shares: the CLI's errors, argument parsers, output and quiet torch.

Argument parsers raise ``argparse.ArgumentTypeError``, which ``Parser`` turns into a
``UsageError``; everything found wrong after parsing raises ``CliError``. Both end the command
with exit status 1 and one line on stderr, ``fxmobile: error: ...``, naming the culprit.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import NoReturn, TextIO

from tabulate import tabulate

from fxmobile.cli.status import StatusLine
from fxmobile.errors import FxMobileError
from fxmobile.options import MobileOptimizerType, member_named

# --format value -> tabulate format; "json" prints one JSON document instead of tables
TABLE_FORMATS = {"table": "simple", "markdown": "github"}
FORMATS = (*TABLE_FORMATS, "json")

# torch 2.15 deprecates TorchScript and the lite interpreter, which are what fxmobile writes; the
# README says so once instead of every command repeating it.
_DEPRECATIONS = (
    r".*torch\.jit\.(script|trace|save|load). is deprecated",
    r".*Lite Interpreter is deprecated",
)


class CliError(FxMobileError, ValueError):
    """Something on the command line names a model, file or option fxmobile cannot use."""


class UsageError(CliError):
    """The command line does not parse: an unknown option, a missing or malformed value."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the argument (``UsageError``), not
    argparse's usage block and exit status 2; its subcommands' parsers are ``Parser`` too."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def add_format(parser: argparse.ArgumentParser) -> None:
    """``--format table|markdown|json``, the same for every command."""
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table (default), markdown (GitHub tables) or json (one JSON document on stdout)",
    )


def input_shape(text: str) -> tuple[int, ...]:
    """``"1,3,224,224"`` -> ``(1, 3, 224, 224)``: comma-separated positive integers."""
    parts = [part.strip() for part in text.replace("x", ",").split(",")]
    try:
        dims = tuple(int(part) for part in parts)
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a shape; expected comma-separated positive integers, e.g. 1,3,224,224"
        )
    return dims


def positive_int(text: str) -> int:
    """``text`` as an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def blocklist_member(text: str) -> MobileOptimizerType:
    """A ``MobileOptimizerType`` member by name (``fxmobile.options.member_named``)."""
    try:
        return member_named(text)
    except KeyError as exc:
        raise argparse.ArgumentTypeError(str(exc.args[0])) from None


def table(
    rows: list[list[object]],
    headers: list[str],
    fmt: str,
    maxcolwidths: list[int | None] | None = None,
    numbers: bool = True,
) -> str:
    """``rows`` in tabulate's format for --format ``fmt`` (table or markdown), cells as given.

    With ``numbers``, every column but the first is right-aligned.
    """
    align = ["left"] + ["right" if numbers else "left"] * (len(headers) - 1)
    return tabulate(
        rows,
        headers=headers,
        tablefmt=TABLE_FORMATS[fmt],
        maxcolwidths=maxcolwidths,
        disable_numparse=True,
        colalign=align,
    )


class Console:
    """Results go to stdout, in every format; status lines and warnings go to stderr, above the
    live status line when stderr is a terminal (``status``: a ``StatusLine``)."""

    def __init__(
        self,
        out: TextIO | None = None,
        err: TextIO | None = None,
        status: StatusLine | None = None,
    ) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.live = status

    def result(self, text: str) -> None:
        """Something the command found: stdout."""
        print(text, file=self.out, flush=True)

    def status(self, text: str) -> None:
        """What the command is doing or did to the model: stderr."""
        if self.live is not None:
            self.live.print(text)
        else:
            print(text, file=self.err, flush=True)

    def warn(self, text: str) -> None:
        """Something the user should act on: stderr, prefixed ``fxmobile: warning:``."""
        self.status(f"fxmobile: warning: {text}")


@contextlib.contextmanager
def quiet_deprecations() -> Iterator[None]:
    """Silence torch's deprecation warnings for TorchScript and the lite interpreter.

    fxmobile produces those formats on purpose; the README states the deprecation once instead.
    """
    with warnings.catch_warnings():
        for message in _DEPRECATIONS:
            warnings.filterwarnings("ignore", message=message)
        yield
