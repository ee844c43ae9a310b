"""Benchmark figures written into a docs page by the script that measured them.

A page marks each block of figures with a pair of HTML comments, which Markdown does not show:

    <!-- figures:NAME -->
    (anything: replaced whole)
    <!-- /figures:NAME -->

``write(name, table, run)`` replaces what lies between the two markers with a header line that
says how the figures were made (date, command, runtime, kernels, threads, the machine's load
before and after) and the table, so no figure in the docs is typed by hand and none is shown
without the conditions it was measured under. The benchmarks call it with ``--write-docs``
(``add_argument``); the page and its blocks are ``docs/pages/performance.md``'s.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "pages" / "performance.md"

_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--write-docs``: also write the figures into their block of the performance page."""
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help=f"also write the figures into their block of {PAGE.relative_to(ROOT)}",
    )


def load() -> tuple[float, int]:
    """The 1-minute load average and the number of cores, for a run's header."""
    return os.getloadavg()[0], os.cpu_count() or 0


@dataclass(frozen=True)
class Run:
    """What figures depend on besides the code: when, by which command, on what, how loaded."""

    command: str  # as typed, from the repository root
    runtime: str  # "torch 2.15.0": what ran the timed code
    kernels: str  # what computed the timed ops: "ATen and fxmobile._C", "XNNPACK"
    threads: int
    load_before: float  # 1-minute load average when the measurement started
    load_after: float  # and when it ended
    cores: int
    date: str  # ISO date and time, UTC, of the end of the run

    def header(self) -> str:
        """One line a reader checks before believing a figure."""
        return (
            f"Measured {self.date} by `{self.command}`: {self.runtime}, kernels {self.kernels}, "
            f"{self.threads} thread{'s' if self.threads != 1 else ''}; load average "
            f"{self.load_before:.1f} before and {self.load_after:.1f} after, on "
            f"{self.cores} cores ({platform.machine()})."
        )


def finish(
    *,
    runtime: str,
    kernels: str,
    threads: int,
    load_before: float,
    argv: Sequence[str] | None = None,
) -> Run:
    """The ``Run`` of a measurement that started at ``load_before`` and ends now; the command is
    ``python`` plus ``argv`` (default ``sys.argv``), ``--write-docs`` included."""
    args = list(sys.argv if argv is None else argv)
    script = Path(args[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    after, cores = load()
    return Run(
        command=shlex.join(["python", str(shown), *args[1:]]),
        runtime=runtime,
        kernels=kernels,
        threads=threads,
        load_before=load_before,
        load_after=after,
        cores=cores,
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]], fmt: str) -> str:
    """A Markdown table; numbers formatted with ``fmt`` (e.g. ``.2f``), ``None`` as "-"."""

    def cell(value: object) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return format(value, fmt)
        return str(value).replace("|", "\\|")

    numeric = [
        all(isinstance(r[i], int | float) or r[i] is None for r in rows) and bool(rows)
        for i in range(len(headers))
    ]
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("| " + " | ".join("---:" if n else "---" for n in numeric) + " |")
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with the block ``name`` holding ``body`` instead of what it held.

    ``ValueError`` names the block when its markers are missing, doubled or out of order: a
    block is written only where the page asks for it.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"figures block name {name!r}: use lowercase letters, digits and -")
    start, end = f"<!-- figures:{name} -->", f"<!-- /figures:{name} -->"
    starts, ends = text.count(start), text.count(end)
    if starts != 1 or ends != 1:
        raise ValueError(
            f"the page needs exactly one {start} and one {end} (found {starts} and {ends})"
        )
    if text.index(end) < text.index(start):
        raise ValueError(f"{end} comes before {start}")
    head, rest = text.split(start)
    tail = rest.split(end)[1]
    return f"{head}{start}\n{body.strip()}\n{end}{tail}"


def blocks(text: str) -> list[str]:
    """The names of the figures blocks ``text`` marks, in order."""
    return re.findall(r"<!-- figures:([^ ]+) -->", text)


def write(name: str, table: str, run: Run, page: Path = PAGE) -> None:
    """Replace the block ``name`` of ``page`` with ``run``'s header line and ``table``."""
    text = page.read_text()
    page.write_text(replace_block(text, name, f"{run.header()}\n\n{table}"))
    print(f"wrote figures:{name} into {page}")
