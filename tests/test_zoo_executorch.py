"""The zoo on ExecuTorch (``python -m model_zoo_checks --runtime executorch``).

On synthetic results: the baseline comparison of fxmobile's program (more delegate calls or
portable ops regress, ExecuTorch's own program never does), the verdict "not strictly better",
the table's columns, the journal and the refusals. Then one real run of a tiny model (a
convolution, a BatchNorm, a ReLU and a cumsum, which XNNPACK has no kernel for, so both
programs leave one portable op) through both flows, written as a baseline, and run again
(``--resume``, from the journal) against that baseline planted better than reality.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fxmobile.executorch
from model_zoo_checks import baseline as bl
from model_zoo_checks.journal import Journal
from model_zoo_checks.output import render_markdown, render_table
from model_zoo_checks.output_executorch import (
    HEADERS,
    TIMED_HEADERS,
    not_strictly_better,
    program_counts,
)
from model_zoo_checks.results import (
    EXECUTORCH,
    FXMOBILE,
    ModelResult,
    ProgramRecord,
    Status,
)
from model_zoo_checks.run import main
from model_zoo_checks.zoo import Kind, ZooModel

needs_executorch = pytest.mark.skipif(
    not fxmobile.executorch.available(), reason="needs ExecuTorch (pip install -e '.[executorch]')"
)


def program(flow: str, **changes: Any) -> ProgramRecord:
    """A program that went through and matched: one delegate call, no portable op."""
    base = ProgramRecord(
        flow,
        through=True,
        passed=True,
        relative_error=1e-6,
        delegate_calls=1,
        portable_ops=0,
        nbytes=2**20,
        seconds=3.0,
    )
    return dataclasses.replace(base, **changes)


def result(ours: ProgramRecord | None = None, theirs: ProgramRecord | None = None) -> ModelResult:
    """A model on ExecuTorch; by default fxmobile's program has 1 delegate call and no portable
    op, ExecuTorch's own 3 delegate calls and 2 portable ops."""
    ours = ours or program(FXMOBILE)
    theirs = theirs or program(
        EXECUTORCH, delegate_calls=3, portable_ops=2, portable_by_op={"aten.cat": 2}
    )
    return ModelResult(
        key="net",
        name="net",
        kind="classification",
        family="net",
        backend="cpu",
        route="fx",
        input_shape=[1, 3, 8, 8],
        status=Status.PASSED if ours.passed else Status.ERROR,
        error=ours.error,
        relative_error=ours.relative_error,
        tolerance=1e-4,
        target_runtime="executorch",
        programs={FXMOBILE: ours, EXECUTORCH: theirs},
    )


# --- the baseline -----------------------------------------------------------------------------


def test_more_portable_ops_than_the_baseline_regress_and_name_the_ops() -> None:
    old = bl.merged({}, [result()])
    worse = program(FXMOBILE, portable_ops=3, portable_by_op={"aten.cumsum": 3})
    (found,) = bl.compare([result(worse)], old)
    assert found.metric is bl.Metric.PORTABLE_OPS
    assert (found.old, found.new) == (0, 3)
    assert "aten.cumsum 0->3" in str(found) and str(found).startswith("net/cpu: portable_ops")


def test_more_delegate_calls_than_the_baseline_regress() -> None:
    old = bl.merged({}, [result()])
    (found,) = bl.compare([result(program(FXMOBILE, delegate_calls=2))], old)
    assert found.metric is bl.Metric.DELEGATE_CALLS and (found.old, found.new) == (1, 2)


def test_a_program_that_went_through_and_no_longer_does_regresses() -> None:
    old = bl.merged({}, [result()])
    gone = program(FXMOBILE, through=False, passed=False, error="ExportError: no")
    gone = dataclasses.replace(gone, relative_error=None, delegate_calls=None, portable_ops=None)
    (found,) = bl.compare([result(gone)], old)
    assert found.metric is bl.Metric.STATUS and "ExportError" in found.detail


def test_fewer_and_executorchs_own_program_never_regress() -> None:
    old = bl.merged({}, [result()])
    better = program(FXMOBILE, delegate_calls=1, portable_ops=0)
    theirs_worse = program(EXECUTORCH, delegate_calls=9, portable_ops=9)
    assert bl.compare([result(better, theirs_worse)], old) == []


def test_the_baseline_keeps_both_programs_without_times(tmp_path: Path) -> None:
    path = tmp_path / "baseline-executorch.json"
    bl.save(bl.merged({}, [result()]), path)
    entry = json.loads(path.read_text())["entries"]["net/cpu"]
    assert set(entry["programs"]) == {FXMOBILE, EXECUTORCH}
    assert entry["programs"][EXECUTORCH]["portable_by_op"] == {"aten.cat": 2}
    assert "seconds" not in entry["programs"][FXMOBILE]  # times do not carry between runs
    loaded = bl.load(path, executorch=True)
    assert loaded["net/cpu"].programs[FXMOBILE].delegate_calls == 1
    assert bl.compare([result()], loaded) == []


def test_each_run_refuses_the_other_runs_baseline(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    bl.save(bl.merged({}, [result()]), path)
    with pytest.raises(ValueError, match=r"--baseline baseline\.json"):
        bl.load(path, executorch=False)
    lite = dataclasses.replace(result(), programs={}, target_runtime=None)
    bl.save(bl.merged({}, [lite]), path)
    assert "programs" not in json.loads(path.read_text())["entries"]["net/cpu"]
    with pytest.raises(ValueError, match=r"--baseline baseline-executorch\.json"):
        bl.load(path, executorch=True)


# --- strictly better, the table, the counts ---------------------------------------------------


def test_not_strictly_better_says_why() -> None:
    assert not_strictly_better(result()) is None  # fewer of both
    assert not_strictly_better(result(theirs=program(EXECUTORCH, passed=False))) is None
    more = program(FXMOBILE, delegate_calls=4, portable_ops=1, portable_by_op={"aten.sort": 1})
    assert not_strictly_better(result(more)) == "more delegate calls (4 vs 3)"  # 1 < 2 ops
    tie = not_strictly_better(result(program(FXMOBILE), program(EXECUTORCH)))
    assert tie == "same counts: 1 delegate call(s), 0 portable op(s)"
    failed = program(FXMOBILE, through=False, passed=False, error="ExportError: no")
    why = not_strictly_better(result(failed))
    assert why == "fails where ExecuTorch's own flow goes through: ExportError: no"
    long = dataclasses.replace(failed, error="PassError: " + "node meta " * 100)
    cut = not_strictly_better(result(long))
    assert cut is not None and len(cut) < 250 and cut.endswith("...")  # the JSON keeps it whole
    both_failed = not_strictly_better(result(failed, program(EXECUTORCH, passed=False)))
    assert both_failed is not None and both_failed.startswith("neither flow")


def test_more_portable_ops_than_executorchs_own_is_not_strictly_better() -> None:
    ours = program(FXMOBILE, portable_ops=3, portable_by_op={"aten.sort": 2, "aten.cumsum": 1})
    why = not_strictly_better(result(ours))
    assert why == "more portable ops (3 vs 2; fxmobile leaves aten.sort 2, aten.cumsum 1)"


def test_the_table_sets_both_programs_side_by_side() -> None:
    untimed = render_table([result()])
    for header in HEADERS:
        assert header in untimed
    assert TIMED_HEADERS[0] not in untimed  # no timed rounds, no latency columns
    assert "1 / 3" in untimed and "0 / 2" in untimed and "matched 1e-06" in untimed
    timed = result(program(FXMOBILE, median_ms=1.5, p10_ms=1.25))
    timed.eager_ms, timed.eager_p10_ms = 4.0, 3.5
    table = render_table([timed])
    assert all(h in table for h in TIMED_HEADERS)
    assert "4.00 / 3.50" in table and "1.50 / 1.25" in table


def test_the_counts_per_kind_and_the_markdown() -> None:
    failed = program(FXMOBILE, through=False, passed=False, error="ExportError: no")
    results = [result(), dataclasses.replace(result(failed), key="other")]
    lines = program_counts(results)
    assert lines[0] == (
        "classification (2 models), fxmobile / ExecuTorch's own: through 1 / 2, matched 1 / 2; "
        "on the 1 both made: delegate calls 1 / 3, portable ops 0 / 2"
    )
    assert lines[1] == "  fxmobile not strictly better on 1 of 2:"
    assert lines[2].startswith("    other: fails where ExecuTorch's own flow goes through")
    page = render_markdown(results, [], {"command": "x"})
    assert "- classification (2 models)" in page and "    - other: fails" in page


def test_the_journal_keeps_only_this_kind_of_run(tmp_path: Path) -> None:
    lite = dataclasses.replace(result(), key="lite", programs={}, target_runtime=None)
    for executorch, kept in ((True, {"net"}), (False, {"lite"})):
        path = tmp_path / f"{executorch}.jsonl"
        journal = Journal(path)
        journal.append([result()])
        journal.append([lite])
        assert Journal(path, resume=True, executorch=executorch).keys == kept
        assert len(path.read_text().splitlines()) == 1  # the other run's line is dropped


def test_executorch_mode_refuses_a_gpu_backend(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--quick", "--models", "resnet18@64x64", "--runtime", "executorch"]
    code = main([*args, "--backend", "vulkan"])
    assert code == 2 and "--backend vulkan" in capsys.readouterr().err


def test_help_says_what_the_executorch_mode_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "executorch: instead of the lite-interpreter file" in text
    assert "baseline-executorch.json" in text


# --- a real run ------------------------------------------------------------------------------


class Tiny(nn.Module):
    """Convolution, BatchNorm, ReLU (one delegate call) and a cumsum (a portable op)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x))).cumsum(-1)


TINY = ["--models", "tiny", "--runtime", "executorch", "--threads", "1"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """One real run of the tiny model through both flows, timed, its baseline written by
    ``--update-baseline``: the output directory and the baseline."""
    if not fxmobile.executorch.available():
        pytest.skip("needs ExecuTorch (pip install -e '.[executorch]')")
    from model_zoo_checks import builders, run

    out = tmp_path_factory.mktemp("zoo-et")
    path = out / "baseline-executorch.json"
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            run, "all_models", lambda: [ZooModel("tiny", Kind.CLASSIFICATION, (1, 3, 16, 16))]
        )
        patch.setattr(builders, "build", lambda entry: Tiny())
        args = [*TINY, "--rounds", "2", "--min-time", "0", "--warmup", "0"]
        assert main([*args, "--out", str(out), "--baseline", str(path), "--update-baseline"]) == 0
        yield out, path
    torch.set_num_threads(threads)


@needs_executorch
def test_the_mode_writes_both_programs_counts(tiny_run: tuple[Path, Path]) -> None:
    out, path = tiny_run
    (record,) = json.loads((out / "zoo.json").read_text())["results"]
    assert record["status"] == "passed" and record["target_runtime"] == "executorch"
    assert record["file_bytes"] is None and record["ops_after"] == {}  # no lite file made
    for flow in (FXMOBILE, EXECUTORCH):
        made = record["programs"][flow]
        assert made["through"] and made["passed"], made
        assert made["delegate_calls"] == 1
        assert made["portable_by_op"] == {"aten.cumsum": 1}
        assert made["median_ms"] > 0 and made["p10_ms"] <= made["median_ms"]
    assert record["eager_ms"] > 0
    page = (out / "zoo.md").read_text()
    assert all(h in page for h in HEADERS + TIMED_HEADERS)
    assert "through 1 / 1, matched 1 / 1" in page
    entry = json.loads(path.read_text())["entries"]["tiny/cpu"]
    assert entry["programs"][FXMOBILE]["portable_ops"] == 1


@needs_executorch
def test_a_program_with_more_portable_ops_than_the_baseline_fails_the_run(
    tiny_run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, path = tiny_run
    from model_zoo_checks import run

    again = [*TINY, "--out", str(out), "--resume", "--rounds", "0"]  # from the journal
    entries = json.loads(path.read_text())
    ours = entries["entries"]["tiny/cpu"]["programs"][FXMOBILE]
    ours["portable_ops"], ours["portable_by_op"] = 0, {}  # planted better than reality
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps(entries))
    tiny = [ZooModel("tiny", Kind.CLASSIFICATION, (1, 3, 16, 16))]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run, "all_models", lambda: tiny)
        capsys.readouterr()
        assert main([*again, "--baseline", str(path)]) == 0
        assert "no regressions against" in capsys.readouterr().out
        assert main([*again, "--baseline", str(planted)]) == 1
    printed = capsys.readouterr().out
    assert "1 regression(s)" in printed
    assert "tiny/cpu: portable_ops 0 -> 1" in printed and "aten.cumsum 0->1" in printed
