"""The live status line on stderr: each phase while it runs and when it ends, on a terminal only.

``StatusLine`` is driven with events directly (no redraw thread, so the output is exact); the
command line is run with a stderr that says it is a terminal, and with one that does not.
"""

from __future__ import annotations

import io
import re
import sys
import time
from pathlib import Path

import pytest

from fxmobile.cli import main
from fxmobile.cli.status import StatusLine
from fxmobile.progress import Event

ERASE = "\r\x1b[K"

NET = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))
"""


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def finished_lines(text: str) -> list[str]:
    """The permanent lines: what is left once every live line is erased."""
    return [line.rsplit(ERASE, 1)[-1] for line in text.split("\n") if line.rsplit(ERASE, 1)[-1]]


def test_a_phase_is_drawn_live_then_left_with_its_time() -> None:
    stream = Terminal()
    line = StatusLine(stream, redraw_seconds=None)
    line.event(Event("capture"))
    assert stream.getvalue().startswith(ERASE + "capture 0.0 s…")
    line.event(Event("capture", seconds=0.42))
    assert stream.getvalue().endswith(ERASE + "capture 0.4 s\n")
    line.close()
    assert finished_lines(stream.getvalue()) == ["capture 0.4 s"]


def test_steps_show_on_the_innermost_phase_and_nested_phases_are_indented() -> None:
    stream = Terminal()
    line = StatusLine(stream, redraw_seconds=None)
    line.event(Event("latency"))
    line.event(Event("latency rounds"))
    line.event(Event("latency rounds", done=3, total=20))
    assert stream.getvalue().rsplit(ERASE, 1)[-1].startswith("latency rounds 3/20 ")
    line.event(Event("latency rounds", seconds=2.0))
    assert stream.getvalue().rsplit(ERASE, 1)[-1].startswith("latency ")  # the outer again
    line.print("fxmobile: warning: busy")
    line.event(Event("latency", seconds=2.5))
    line.close()
    assert finished_lines(stream.getvalue()) == [
        "  latency rounds 2.0 s",
        "fxmobile: warning: busy",
        "latency 2.5 s",
    ]
    assert stream.getvalue().endswith("\n")  # nothing live is left on the line


def test_the_line_redraws_itself_while_a_phase_runs() -> None:
    stream = Terminal()
    line = StatusLine(stream, redraw_seconds=0.01)
    line.event(Event("lowering to XNNPACK"))
    for _ in range(500):  # at most 5 s on a loaded machine
        if stream.getvalue().count(ERASE) >= 3:
            break
        time.sleep(0.01)
    line.close()
    assert stream.getvalue().count(ERASE + "lowering to XNNPACK") >= 3


def test_no_status_line_when_stderr_is_not_a_terminal() -> None:
    assert StatusLine.for_stream(io.StringIO()) is None
    assert isinstance(StatusLine.for_stream(Terminal()), StatusLine)


@pytest.fixture(scope="module")
def net_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("status") / "net.py"
    path.write_text(NET)
    return path


def test_optimize_on_a_terminal_shows_every_phase_with_its_time(
    net_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``optimize`` printed one status line, then nothing until it was done, before."""
    stderr, stdout = Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(sys, "stdout", stdout)
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{net_file}:Net", "-o", str(out), "--input-shape", "1,3,8,8"]
    assert main([*argv, "--latency", "--rounds", "2"]) == 0
    done = finished_lines(stderr.getvalue())
    names = [re.sub(r" \d+\.\d s$", "", line).strip() for line in done if line.endswith(" s")]
    for phase in (
        "building the model",
        "capture",
        "FX passes",
        "scripting",
        "TorchScript passes",
        "checking against eager",
        "writing the file",
        "checking the file against eager",
        "starting a clean child process",
        "latency rounds",
    ):
        assert phase in names, (phase, done)
    assert any(line.startswith("optimizing ") for line in done)  # status above the live line
    assert ERASE not in stdout.getvalue()  # the results are left alone


def test_optimize_without_a_terminal_prints_no_progress(
    net_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{net_file}:Net", "-o", str(out), "--input-shape", "1,3,8,8"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert ERASE not in err and "\r" not in err
    assert not re.search(r"^(capture|FX passes) \d", err, re.MULTILINE)
    assert err.startswith("optimizing ")
