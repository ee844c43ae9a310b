"""``fxmobile passes``, and the README's pass tables held to what the pipelines run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fxmobile.cli import main
from fxmobile.cli.passes_cmd import rows
from fxmobile.options import Backend

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_table(heading: str) -> list[tuple[str, str]]:
    """(pass, member) of each row of the first Markdown table after the line starting with
    ``heading``."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    table: list[tuple[str, str]] = []
    for line in lines[start + 1 :]:
        if table and not line.startswith("|"):
            break
        match = re.match(r"\| `(\w+)`[^|]*\| (?:`(\w+)`|—) \|", line)
        if match:
            table.append((match[1], match[2] or "—"))
    return table


def test_the_readme_fx_table_is_the_fx_stage_in_order() -> None:
    fx = [(r[1], r[2]) for r in rows(Backend.CPU) if r[0] == "fx"]
    assert readme_table("FX stage, in order") == fx


def test_the_readme_cpu_table_is_the_cpu_torchscript_stage_in_order() -> None:
    script = [(r[1], r[2]) for r in rows(Backend.CPU) if r[0] == "script"]
    assert readme_table("TorchScript stage for the CPU") == script


@pytest.mark.parametrize("backend", list(Backend))
def test_every_pass_states_its_rewrite(backend: Backend) -> None:
    assert all(isinstance(r[3], str) and " -> " in r[3] for r in rows(backend))


def test_vulkan_lists_only_the_member_it_reads(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["passes", "--backend", "vulkan", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    script_rows = [line for line in out.splitlines() if line.startswith("| script")]
    members = {line.split("|")[3].strip() for line in script_rows}
    assert members == {"—", "VULKAN_AUTOMATIC_GPU_TRANSFER"}
    assert "| script  | fold_batchnorm " in out
