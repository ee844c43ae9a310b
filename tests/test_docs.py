"""The README and the docs pages held to the code: every code block runs, the tables name what
fxmobile has, every page is in the site, and the benchmarks' figures blocks are wired.

How a page's blocks run (docs/pages/contributing.md says the same to writers):

- ``python`` blocks run with Sybil, in page order, in one namespace per page, in a fresh
  working directory (a file one block writes is there for the next);
- ``bash`` blocks run line by line in that directory, each line an ``fxmobile`` command (run as
  ``python -m fxmobile``), and each must exit 0;
- ``text`` blocks are output shown to the reader, and are not run;
- a block that cannot run here (app code for a phone, ``make`` itself) is preceded by
  ``<!-- skip: next "KEY" -->``, KEY one of ``NOT_RUN``'s reasons, and ``SKIPPED`` lists every
  such block, page by page: the set that does not run is small and explicit;
- blocks that need the reference runtimes sit between ``<!-- skip: start if(not
  runtimes_installed(), reason="runtimes") -->`` and ``<!-- skip: end -->``: they run where
  ``make runtimes`` installed them, as tests/test_runtime_*.py do, and the page's test says so
  when they did not.

Where each page runs: ``make test`` runs every page but those in ``SLOW_PAGES``; ``make
test-slow`` runs those.
"""

from __future__ import annotations

import builtins
import os
import re
import shlex
import subprocess
import sys
import unittest
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from torch import nn

import fxmobile
from benchmarks import (
    bench_executorch,
    bench_optimize_time,
    bench_prepacked_ops,
    figures,
    profile_ops,
)
from fxmobile.cli.passes_cmd import rows
from fxmobile.executorch.passes.pipeline import export_pipeline
from fxmobile.options import Backend
from fxmobile.runtime import installed
from fxmobile.runtime.install import RUNTIMES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = DOCS / "pages"
MKDOCS = DOCS / "mkdocs.yml"

# Languages of fenced blocks, by what the tests do with them.
RUN = ("python", "bash")
SHOWN = ("text",)  # output a reader sees; never run
APP = ("java", "objectivec", "swift")  # app code for a phone: never runs here

# Why a block may not run, by the key its skip directive names.
NOT_RUN = {
    "make": "`make demo` and `make test` build .venv and run the whole suite, which `make test` "
    "cannot run inside itself; the lead runs them on a fresh clone",
    "app": "app code for a phone: it needs the Android SDK or Xcode and a device",
}
# Every block that does not run, page by page, by reason: a new one fails
# test_only_the_listed_blocks_are_not_run until it is listed here.
SKIPPED = {
    "README.md": ["make", "app", "app", "app", "app"],
}
# Pages whose blocks take long enough to leave to `make test-slow` (none today: the ExecuTorch
# lowerings are of small models but the README's, which `make test` runs).
SLOW_PAGES: frozenset[str] = frozenset()

# The scripts that write each figures block of the performance page (``--write-docs``): a
# script's ``FIGURES`` names its block, or its blocks.
FIGURE_WRITERS = {
    block: module.__name__
    for module in (bench_executorch, bench_optimize_time, bench_prepacked_ops, profile_ops)
    for block in ((module.FIGURES,) if isinstance(module.FIGURES, str) else module.FIGURES)
}

README_LINES = 250  # a newcomer reads it in five minutes

_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
# a skip directive as Sybil reads it: an HTML comment opening a line
_SKIP = re.compile(r"^[ \t]*<!-- skip: (?P<action>next|start|end)(?P<rest>.*?) -->", re.M)


def pages() -> list[Path]:
    """The README and every docs page."""
    return [README, *sorted(PAGES.rglob("*.md"))]


def name(page: Path) -> str:
    """A page as the tables here name it: README.md, or its path under docs/pages."""
    return "README.md" if page == README else str(page.relative_to(PAGES))


def fences(page: Path) -> Iterator[tuple[int, str]]:
    """(line, language) of every fenced code block of ``page``."""
    lines = page.read_text().splitlines()
    inside = None
    for number, line in enumerate(lines, 1):
        match = _FENCE.match(line.strip())
        if match is None:
            continue
        if inside is None:
            inside = match["fence"]
            yield number, match["info"].strip()
        elif match["fence"].startswith(inside) and not match["info"].strip():
            inside = None


def runtimes_installed() -> bool:
    """Whether ``make runtimes`` installed every reference runtime."""
    return all(installed(version) for version in RUNTIMES)


def run_commands(example: Example) -> None:
    """A ``bash`` block: each line an ``fxmobile`` command, run in the working directory, that
    must exit 0."""
    for line in str(example.parsed).splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] == "fxmobile", (
            f"{example.path}:{example.line}: a bash block runs fxmobile commands only, got "
            f'{line!r}; mark a block that cannot run with <!-- skip: next "KEY" -->'
        )
        done = subprocess.run(
            [sys.executable, "-m", "fxmobile", *words[1:]],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert done.returncode == 0, (
            f"{example.path}:{example.line}: `{line}` exited {done.returncode}:\n"
            f"{done.stderr[-3000:]}"
        )


def refuse_app_code(example: Example) -> None:
    """App code reached without its skip directive."""
    raise AssertionError(
        f"{example.path}:{example.line}: app code cannot run here; precede it with "
        f'<!-- skip: next "app" -->'
    )


def sybil() -> Sybil:
    """Sybil with this file's parsers: Python, fxmobile commands, app code, skip directives."""
    parsers: list[Any] = [
        PythonCodeBlockParser(),
        CodeBlockParser("bash", run_commands),
        *(CodeBlockParser(language, refuse_app_code) for language in APP),
        SkipParser(),
    ]
    return Sybil(parsers)


def _page_params() -> list[Any]:
    return [
        pytest.param(page, id=name(page), marks=[pytest.mark.slow] * (name(page) in SLOW_PAGES))
        for page in pages()
    ]


@pytest.mark.parametrize("page", _page_params())
def test_every_block_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block of the page, in order, in a fresh directory; a failure names its line."""
    monkeypatch.chdir(tmp_path)
    document = sybil().parse(page)
    document.namespace["runtimes_installed"] = runtimes_installed
    waiting: list[int] = []
    for example in document.examples():
        try:
            example.evaluate()
        except unittest.SkipTest as skipped:
            if str(skipped) == "runtimes":
                waiting.append(example.line)
            else:
                assert str(skipped) in NOT_RUN, f"{page}:{example.line}: skipped for {skipped}"
    if waiting:
        pytest.skip(
            f"the blocks at lines {waiting} need the reference runtimes (make runtimes); "
            f"the page's other blocks ran"
        )


@pytest.mark.parametrize("page", pages(), ids=name)
def test_every_block_names_a_language_the_tests_know(page: Path) -> None:
    for line, language in fences(page):
        assert language in (*RUN, *SHOWN, *APP), (
            f"{name(page)}:{line}: a block in {language or 'no language'}; use python or bash "
            f"(run), text (output shown), or {', '.join(APP)} (app code, not run)"
        )


def test_only_the_listed_blocks_are_not_run() -> None:
    found: dict[str, list[str]] = {}
    for page in pages():
        for match in _SKIP.finditer(page.read_text()):
            rest = match["rest"].strip()
            if match["action"] == "end" or rest.startswith("if(not runtimes_installed()"):
                continue
            key = re.fullmatch(r'"(\w+)"', rest)
            assert key and key[1] in NOT_RUN, (
                f"{name(page)}: <!-- skip: {match['action']} {rest} -->: skip with one of "
                f"{sorted(NOT_RUN)}, or list a new reason in NOT_RUN"
            )
            assert match["action"] == "next", f"{name(page)}: skip one block at a time"
            found.setdefault(name(page), []).append(key[1])
    assert found == SKIPPED


def test_every_app_block_is_skipped_as_app_code() -> None:
    for page in pages():
        lines = page.read_text().splitlines()
        for line, language in fences(page):
            if language in APP:
                assert lines[line - 2] == '<!-- skip: next "app" -->', f"{name(page)}:{line}"


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= README_LINES


def test_every_page_is_in_the_nav_and_linked_from_the_readme() -> None:
    config = yaml.safe_load(MKDOCS.read_text())
    assert (DOCS / config["docs_dir"]) == PAGES
    nav = [next(iter(entry.values())) for entry in config["nav"]]
    on_disk = [str(p.relative_to(PAGES)) for p in PAGES.rglob("*.md")]
    assert sorted(nav) == sorted(on_disk)
    readme = README.read_text()
    missing = [p for p in nav if f"](docs/pages/{p})" not in readme]
    assert not missing, f"the README's documentation list does not link {missing}"


# ------------------------------------------------------------------------ tables held to code


def test_the_api_reference_shows_every_public_name() -> None:
    """``fxmobile.__all__`` is the public API: each name is in the generated reference."""
    page = (PAGES / "reference.md").read_text()
    shown = set(re.findall(r"^::: fxmobile\.(\w+)$", page, re.M))
    shown |= set(re.findall(r"^ +- (\w+)$", page, re.M))  # a members: list
    assert sorted(set(fxmobile.__all__) - shown) == []


def section(page: Path, heading: str) -> str:
    """The lines after the heading ``heading`` up to the next heading of any level (a ``#``
    line inside a code block is no heading)."""
    lines = page.read_text().splitlines()
    code = {n for start, _ in fences(page) for n in range(start, _fence_end(lines, start) + 1)}
    headings = [
        n for n, line in enumerate(lines, 1) if n not in code and re.match(r"#{1,6} ", line)
    ]
    start = next((n for n in headings if lines[n - 1].lstrip("#").strip() == heading), None)
    assert start is not None, f"{name(page)} has no heading {heading!r}"
    end = next((n for n in headings if n > start), len(lines) + 1)
    return "\n".join(lines[start : end - 1])


def _fence_end(lines: list[str], start: int) -> int:
    """The line that closes the fence opened at line ``start``."""
    fence = _FENCE.match(lines[start - 1].strip())
    assert fence is not None
    for n in range(start + 1, len(lines) + 1):
        close = _FENCE.match(lines[n - 1].strip())
        if close and close["fence"].startswith(fence["fence"]) and not close["info"].strip():
            return n
    return len(lines)


def pass_table(heading: str) -> list[tuple[str, str]]:
    """(pass, member) of each row of the pass table in the section ``heading`` of passes.md."""
    found = re.findall(
        r"^\| `(\w+)`[^|]*\| (?:`(\w+)`|—) \|", section(PAGES / "passes.md", heading), re.M
    )
    return [(p, member or "—") for p, member in found]


def test_the_fx_table_is_the_fx_stage_in_order() -> None:
    fx = [(r[1], r[2]) for r in rows(Backend.CPU) if r[0] == "fx"]
    assert pass_table("FX stage") == fx


def test_the_cpu_table_is_the_cpu_torchscript_stage_in_order() -> None:
    script = [(r[1], r[2]) for r in rows(Backend.CPU) if r[0] == "script"]
    assert pass_table("TorchScript stage for the CPU") == script


def test_the_export_table_is_the_executorch_export_stage_in_order() -> None:
    export = [(p.name, p.optimization.name if p.optimization else "—") for p in export_pipeline()]
    assert pass_table("ExecuTorch export stage") == export


def test_every_exception_the_refusal_table_names_is_fxmobiles() -> None:
    """A user catches what the "Bad input" table names as ``fxmobile.<Name>``, and it derives
    from the built-in the row names with it (``ScriptingError (RuntimeError)``)."""
    named = set()
    for row in re.findall(r"^\| .*$", (PAGES / "bad-input.md").read_text(), re.M):
        cells = row.split(" | ")
        if len(cells) < 3:
            continue
        for error, builtin in re.findall(r"`(\w+Error)`(?: \(`(\w+Error)`\))?", cells[1]):
            if hasattr(builtins, error):
                continue
            named.add(error)
            cls = getattr(fxmobile, error, None)
            assert isinstance(cls, type), f"bad-input.md names {error}; fxmobile.{error} is missing"
            assert issubclass(cls, fxmobile.FxMobileError)
            if builtin:
                assert issubclass(cls, getattr(builtins, builtin)), f"{error} is no {builtin}"
    assert {"CaptureError", "ScriptingError", "InvalidArgumentError"} <= named


def test_a_ptl_file_does_not_load_in_a_fresh_process_without_fxmobile(tmp_path: Path) -> None:
    """The README's warning, as torch words it: the error names the prepacked ops, not fxmobile;
    with ``import fxmobile`` first the same file loads."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)).eval()
    path = tmp_path / "model.ptl"
    fxmobile.optimize(model, example_inputs=torch.randn(1, 3, 8, 8)).save(path)
    code = f"from torch.jit.mobile import _load_for_lite_interpreter as load\nload({str(path)!r})\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode != 0
    assert "Following ops cannot be found: [prepacked::" in done.stderr
    assert "fxmobile" not in done.stderr.split("RuntimeError", 1)[1]
    fresh = subprocess.run(
        [sys.executable, "-c", "import fxmobile\n" + code],
        capture_output=True,
        env=env,
        check=False,
    )
    assert fresh.returncode == 0, fresh.stderr


# ----------------------------------------------------------------------------- figures blocks


def test_every_figures_block_is_written_by_a_benchmark() -> None:
    """Each block of the performance page is some script's ``FIGURES``, and the reverse."""
    assert sorted(figures.blocks(figures.PAGE.read_text())) == sorted(FIGURE_WRITERS)


def test_a_figures_block_is_replaced_whole_with_its_header_and_table(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Speed\n\nBefore.\n\n<!-- figures:demo -->\nold figures\n<!-- /figures:demo -->\n\n"
        "After.\n<!-- figures:other -->\nkept\n<!-- /figures:other -->\n"
    )
    run = figures.Run(
        command="python benchmarks/x.py --write-docs",
        runtime="torch 2.15.0",
        kernels="fxmobile._C",
        threads=2,
        load_before=0.4,
        load_after=1.25,
        cores=2,
        date="2026-11-27 10:00 UTC",
    )
    table = figures.markdown_table(
        ["model", "ms", "ratio"], [["a", 1.234, None], ["b", 2, 0.5]], ".2f"
    )
    figures.write("demo", table, run, page=page)
    text = page.read_text()
    block = text.split("<!-- figures:demo -->\n")[1].split("<!-- /figures:demo -->")[0]
    assert "old figures" not in text
    assert block.splitlines()[0] == (
        "Measured 2026-11-27 10:00 UTC by `python benchmarks/x.py --write-docs`: torch 2.15.0, "
        f"kernels fxmobile._C, 2 threads; load average 0.4 before and 1.2 after, on 2 cores "
        f"({__import__('platform').machine()})."
    )
    assert (
        "| model | ms | ratio |\n| --- | ---: | ---: |\n| a | 1.23 | - |\n| b | 2 | 0.50 |" in block
    )
    assert text.startswith("# Speed\n\nBefore.\n\n") and text.endswith(
        "\n\nAfter.\n<!-- figures:other -->\nkept\n<!-- /figures:other -->\n"
    )
    figures.write("demo", table, run, page=page)  # a second run replaces the first
    assert page.read_text() == text


@pytest.mark.parametrize(
    "text",
    [
        "no block here",
        "<!-- figures:demo -->\nonly a start",
        "<!-- /figures:demo -->\n<!-- figures:demo -->",
        "<!-- figures:demo -->\n<!-- /figures:demo -->\n" * 2,
    ],
)
def test_a_figures_block_is_written_only_where_the_page_marks_it_once(text: str) -> None:
    with pytest.raises(ValueError, match="figures:demo"):
        figures.replace_block(text, "demo", "| a |")


def test_the_run_header_names_the_command_as_typed() -> None:
    run = figures.finish(
        runtime="torch 2.15.0",
        kernels="k",
        threads=1,
        load_before=0.0,
        argv=[str(ROOT / "benchmarks" / "bench_prepacked_ops.py"), "--rounds", "5", "--write-docs"],
    )
    assert run.command == "python benchmarks/bench_prepacked_ops.py --rounds 5 --write-docs"
    assert "1 thread;" in run.header()
