"""What every subcommand shares: the CLI's error, argument parsers, output and quiet torch.

Argument parsers raise ``argparse.ArgumentTypeError`` (argparse turns it into a usage error, exit
status 2); everything found wrong after parsing raises ``CliError`` (exit status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import TextIO

from tabulate import tabulate

from fxmobile.errors import FxMobileError
from fxmobile.options import MobileOptimizerType, member_named

# --format value -> tabulate format
TABLE_FORMATS = {"table": "simple", "markdown": "github"}

# torch 2.15 deprecates TorchScript and the lite interpreter, which are what fxmobile writes; the
# README says so once instead of every command repeating it.
_DEPRECATIONS = (
    r".*torch\.jit\.(script|trace|save|load). is deprecated",
    r".*Lite Interpreter is deprecated",
)


class CliError(FxMobileError, ValueError):
    """Something on the command line names a model, file or option fxmobile cannot use."""


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
    """Results go to stdout; progress goes there too, except with --format json, where stdout
    carries the JSON document alone and progress goes to stderr."""

    def __init__(self, fmt: str, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.json = fmt == "json"
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def result(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def progress(self, text: str) -> None:
        print(text, file=self.err if self.json else self.out, flush=True)

    def warn(self, text: str) -> None:
        print(f"fxmobile: warning: {text}", file=self.err, flush=True)


@contextlib.contextmanager
def quiet_deprecations() -> Iterator[None]:
    """Silence torch's deprecation warnings for TorchScript and the lite interpreter.

    fxmobile produces those formats on purpose; the README states the deprecation once instead.
    """
    with warnings.catch_warnings():
        for message in _DEPRECATIONS:
            warnings.filterwarnings("ignore", message=message)
        yield
