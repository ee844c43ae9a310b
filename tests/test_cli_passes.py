"""``fxmobile passes``: every pass of each backend, in order, with its member and rewrite.

The docs' pass tables are held to the pipelines in tests/test_docs.py."""

from __future__ import annotations

import json

import pytest

from fxmobile.cli import main
from fxmobile.cli.passes_cmd import rows
from fxmobile.options import Backend


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


@pytest.mark.parametrize("backend", list(Backend))
def test_passes_as_json_are_the_rows(backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    """``passes`` had no JSON output before (``--format json`` was a usage error)."""
    assert main(["passes", "--backend", backend.value, "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["backend"] == backend.name
    assert [
        (p["stage"], p["pass"], p["blocklist_member"] or "—", p["rewrite"])
        for p in document["passes"]
    ] == [tuple(row) for row in rows(backend)]
    assert all(p["blocklist_member"] != "—" for p in document["passes"])
