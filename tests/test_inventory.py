"""The inventory tool's plumbing (its model-by-model results are the slow zoo tests' job)."""

from __future__ import annotations

import pytest

from model_zoo_checks.inventory import _by_key, main, probe_guarded


def test_a_guarded_child_runs_without_an_output_directory() -> None:
    # the child prints its record: --out is the parent's; requiring it everywhere made every
    # child exit with a usage error, recorded as a crash of every model
    record = probe_guarded(_by_key()["timm:lcnet_050"], timeout=300.0, routes=["defaults"])
    assert "error" not in record, record.get("error")
    assert record["routes"]["defaults"]["outcome"] == "ok"


def test_the_parent_still_asks_for_an_output_directory(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--kind", "timm"])
    assert "--out DIR is required" in capsys.readouterr().err
