"""The zoo on the real runtimes (``--runtime``), shards and their merge, latency confirmation,
and NaN errors.

The baseline rules, the merge and the confirmation are tested on synthetic results; the real
runtimes run one small model end to end (``runtime`` marker: skipped, with the reason, when
``make runtimes`` has not installed them).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from model_zoo_checks import baseline as bl
from model_zoo_checks.confirm import RETIME_MIN_TIME, confirm_latency
from model_zoo_checks.merge import MergeError, merge_shards
from model_zoo_checks.merge import main as merge_main
from model_zoo_checks.output import render_problems, render_table, runtime_counts
from model_zoo_checks.results import ModelResult, RuntimeRecord, Status
from model_zoo_checks.run import main, shard_of
from model_zoo_checks.runner import RunOptions, _verdict, check_model
from model_zoo_checks.zoo import Kind, ZooModel, all_models, quick_models

NAN = float("nan")


@pytest.fixture(autouse=True)
def _keep_torch_threads() -> Any:
    """The runner sets torch's thread count; give the next test module the one it had."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def ok_on(version: str, error: float = 1e-6) -> RuntimeRecord:
    return RuntimeRecord(version, "XNNPACK", loads=True, passed=True, relative_error=error)


def result(**changes: Any) -> ModelResult:
    """A passing CPU result of a made-up model, checked on both runtimes; ``changes`` override
    fields."""
    base = ModelResult(
        key="net",
        name="net",
        kind="classification",
        family="net",
        backend="cpu",
        route="fx",
        input_shape=[1, 3, 8, 8],
        status=Status.PASSED,
        relative_error=1e-6,
        tolerance=1e-4,
        top5_match=True,
        unfused_ops=10,
        eager_ms=10.0,
        optimized_ms=5.0,
        runtimes={"1.13.1": ok_on("1.13.1"), "2.12.1": ok_on("2.12.1")},
        runtime_ms={"eager": 10.0, "fxmobile": 4.0, "upstream": 5.0},
    )
    return dataclasses.replace(base, **changes)


def metrics(regressions: list[bl.Regression]) -> list[str]:
    return [r.metric.value for r in regressions]


# --- NaN ------------------------------------------------------------------------------------


def test_a_nan_relative_error_fails_the_model() -> None:
    status, why = _verdict(result(relative_error=NAN))
    assert status is Status.FAILED
    assert why is not None and "nan" in why


def test_a_nan_relative_error_regresses_against_the_baseline() -> None:
    old = bl.merged({}, [result()])
    found = bl.compare([result(relative_error=NAN, status=Status.FAILED)], old)
    assert metrics(found) == ["status", "relative_error"]


def test_a_nan_latency_ratio_regresses() -> None:
    old = bl.merged({}, [result()])
    found = bl.compare([result(optimized_ms=NAN)], old)
    assert metrics(found) == ["latency_ratio"]


def test_a_nan_in_the_baseline_is_a_known_failure_not_a_crash() -> None:
    failed = result(relative_error=NAN, status=Status.FAILED)
    assert bl.compare([failed], bl.merged({}, [failed])) == []


# --- the runtimes against the baseline --------------------------------------------------------


def test_a_file_that_stops_loading_on_a_runtime_regresses() -> None:
    old = bl.merged({}, [result()])
    refused = RuntimeRecord("1.13.1", "XNNPACK", loads=False, error="Following ops cannot be found")
    (found,) = bl.compare([result(runtimes={**result().runtimes, "1.13.1": refused})], old)
    assert found.metric is bl.Metric.RUNTIME
    assert (found.old, found.new) == ("ok", "does not load")
    assert "1.13.1" in found.detail and "cannot be found" in found.detail


def test_a_file_that_loaded_but_differed_and_now_does_not_load_regresses() -> None:
    differs = RuntimeRecord("2.12.1", "XNNPACK", loads=True, relative_error=1.0)
    gone = RuntimeRecord("2.12.1", "XNNPACK", loads=False, error="no")
    old = bl.merged({}, [result(runtimes={"2.12.1": differs})])
    assert metrics(bl.compare([result(runtimes={"2.12.1": differs})], old)) == []
    assert metrics(bl.compare([result(runtimes={"2.12.1": gone})], old)) == ["runtime"]


def test_a_file_that_now_differs_on_a_runtime_regresses() -> None:
    old = bl.merged({}, [result()])
    differs = RuntimeRecord("2.12.1", "XNNPACK", loads=True, relative_error=NAN)
    found = bl.compare([result(runtimes={**result().runtimes, "2.12.1": differs})], old)
    assert metrics(found) == ["runtime"]


def test_runtimes_not_in_the_baseline_or_not_checked_are_not_regressions() -> None:
    old = bl.merged({}, [result(runtimes={}, runtime_ms={})])
    refused = RuntimeRecord("1.13.1", "XNNPACK", loads=False, error="no")
    assert bl.compare([result(runtimes={"1.13.1": refused})], old) == []
    assert bl.compare([result(runtimes={}, runtime_ms={})], bl.merged({}, [result()])) == []


def test_runtime_latency_ratio_against_upstream_has_the_noise_margin() -> None:
    old = bl.merged({}, [result()])  # fxmobile 4.0 / upstream 5.0 = 0.8
    within = result(runtime_ms={"eager": 10.0, "fxmobile": 4.9, "upstream": 5.0})  # 0.98
    slower = result(runtime_ms={"eager": 10.0, "fxmobile": 5.5, "upstream": 5.0})  # 1.1
    assert bl.compare([within], old) == []
    (found,) = bl.compare([slower], old)
    assert found.metric is bl.Metric.RUNTIME_RATIO
    assert math.isclose(found.bound, 1.0)


def test_the_baseline_keeps_what_a_run_did_not_check() -> None:
    old = bl.merged({}, [result()])
    only_new = result(runtimes={"1.13.1": ok_on("1.13.1")}, runtime_ms={})
    entry = bl.merged(old, [only_new])["net/cpu"]
    assert entry.runtimes == {"1.13.1": "ok", "2.12.1": "ok"}
    assert entry.runtime_ratio == pytest.approx(0.8)


def test_runtime_records_round_trip_json(tmp_path: Path) -> None:
    original = result()
    back = ModelResult.from_dict(json.loads(json.dumps(original.to_dict())))
    assert back == original
    assert isinstance(back.runtimes["1.13.1"], RuntimeRecord)
    path = tmp_path / "baseline.json"
    bl.save(bl.merged({}, [original]), path)
    assert bl.load(path)["net/cpu"].runtimes == {"1.13.1": "ok", "2.12.1": "ok"}


def test_the_table_names_runtime_and_kernels_and_counts_loads() -> None:
    refused = RuntimeRecord("1.13.1", "XNNPACK", loads=False, error="Following ops cannot be found")
    results = [result(), result(key="other", runtimes={"1.13.1": refused})]
    table = render_table(results)
    assert "on 1.13.1" in table and "on 2.12.1" in table
    assert "fxmobile file (2.12.1, XNNPACK)" in table
    assert "upstream file (2.12.1, XNNPACK)" in table
    assert "DOES NOT LOAD" in table
    assert runtime_counts(results) == [
        "torch 1.13.1: 1/2 files load, 1/2 match eager",
        "torch 2.12.1: 1/1 files load, 1/1 match eager",
    ]
    assert any("other/cpu on torch 1.13.1: does not load" in p for p in render_problems(results))


# --- confirming latency regressions ---------------------------------------------------------


def entry(name: str = "net") -> ZooModel:
    return ZooModel(name, Kind.CLASSIFICATION, (1, 3, 8, 8))


class Retimer:
    """A check that returns the scripted re-timed result and records its options."""

    def __init__(self, again: ModelResult) -> None:
        self.again = again
        self.options: list[RunOptions] = []

    def __call__(self, model: ZooModel, options: RunOptions) -> list[ModelResult]:
        self.options.append(options)
        return [dataclasses.replace(self.again)]


def test_a_latency_regression_that_vanishes_when_retimed_alone_is_not_reported() -> None:
    old = bl.merged({}, [result()])
    noisy = result(optimized_ms=9.0, runtime_ms={"eager": 10, "fxmobile": 9.0, "upstream": 5})
    retimer = Retimer(result(optimized_ms=5.2))
    found = confirm_latency([noisy], old, bl.Thresholds(), [entry()], RunOptions(), retimer)
    assert found.regressions == []
    assert len(found.not_confirmed) == 2  # latency_ratio and runtime_ratio
    assert all("re-timed alone" in line for line in found.not_confirmed)
    (again,) = found.results
    assert again.retimed_from == {"latency_ratio": 0.9, "runtime_ratio": 1.8}
    (options,) = retimer.options
    assert options.min_time >= RETIME_MIN_TIME


def test_a_latency_regression_that_stays_when_retimed_is_reported() -> None:
    old = bl.merged({}, [result()])
    slow = result(optimized_ms=9.0)
    found = confirm_latency(
        [slow], old, bl.Thresholds(), [entry()], RunOptions(), Retimer(result(optimized_ms=8.5))
    )
    assert metrics(found.regressions) == ["latency_ratio"]
    assert found.regressions[0].new == pytest.approx(0.85)
    assert found.not_confirmed == []


def test_other_regressions_are_not_retimed() -> None:
    old = bl.merged({}, [result()])
    retimer = Retimer(result())
    found = confirm_latency(
        [result(unfused_ops=11)], old, bl.Thresholds(), [entry()], RunOptions(), retimer
    )
    assert metrics(found.regressions) == ["unfused_ops"]
    assert retimer.options == []


# --- shards and merge -----------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_are_disjoint_cover_the_selection_and_are_deterministic(count: int) -> None:
    models = all_models()
    shards = [shard_of(models, i, count) for i in range(1, count + 1)]
    keys = [m.key for s in shards for m in s]
    assert sorted(keys) == sorted(m.key for m in models)
    assert len(keys) == len(set(keys))
    assert [m.key for m in shard_of(all_models(), 1, count)] == [m.key for m in shards[0]]


def test_shard_arguments_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0/2", "3/2", "x"):
        with pytest.raises(SystemExit) as exit_info:
            main(["--shard", bad, "--list"])
        assert exit_info.value.code == 2
    assert main(["--quick", "--shard", "2/5", "--list"]) == 0
    assert quick_models()[1].key in capsys.readouterr().out


def shard_doc(index: int, count: int, *results: ModelResult) -> dict[str, Any]:
    meta = {"shard": f"{index}/{count}", "command": "x", "thresholds": {}, "runtimes": ["2.12.1"]}
    return {"meta": meta, "results": [r.to_dict() for r in results], "regressions": []}


def test_merge_joins_shards_in_order() -> None:
    a, b, c = (result(key=k, name=k) for k in "abc")
    docs = [(Path("2.json"), shard_doc(2, 2, b)), (Path("1.json"), shard_doc(1, 2, a, c))]
    results, meta, missing = merge_shards(docs)
    assert [r.key for r in results] == ["a", "c", "b"]
    assert missing == []
    assert meta["merged_shards"] == ["1.json", "2.json"]


@pytest.mark.parametrize(
    ("docs", "message"),
    [
        ([shard_doc(1, 2, result()), shard_doc(1, 2, result(key="b"))], "both shard 1/2"),
        ([shard_doc(1, 2, result()), shard_doc(2, 3, result(key="b"))], "different splits"),
        ([shard_doc(1, 2, result()), shard_doc(2, 2, result())], "net/cpu is in"),
        ([{"meta": {}, "results": []}], "not a shard"),
    ],
)
def test_merge_refuses_what_is_not_one_run(docs: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(MergeError, match=message):
        merge_shards([(Path(f"{i}.json"), d) for i, d in enumerate(docs)])


def test_merge_cli_checks_the_baseline_and_names_missing_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = tmp_path / "baseline.json"
    bl.save(bl.merged({}, [result(), result(key="b")]), baseline)
    refused = RuntimeRecord("1.13.1", "XNNPACK", loads=False, error="no")
    one, two = tmp_path / "1.json", tmp_path / "2.json"
    one.write_text(json.dumps(shard_doc(1, 2, result())))
    two.write_text(json.dumps(shard_doc(2, 2, result(key="b", runtimes={"1.13.1": refused}))))
    out = tmp_path / "merged"
    assert merge_main([str(one), str(two), "--baseline", str(baseline), "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "b/cpu: runtime ok -> does not load" in printed
    assert json.loads((out / "zoo.json").read_text())["regressions"][0]["metric"] == "runtime"
    assert merge_main([str(one), "--baseline", str(baseline)]) == 1
    assert "missing shard(s) 2/2" in capsys.readouterr().out
    assert main(["merge", str(one), str(one)]) == 2


# --- on the real runtimes -------------------------------------------------------------------


@pytest.mark.runtime()
def test_a_zoo_model_loads_matches_and_is_timed_on_both_runtimes(tmp_path: Path) -> None:
    model = quick_models()[0]
    options = RunOptions(rounds=2, min_time=0.0, warmup=1, runtimes=("1.13.1", "2.12.1"))
    (found,) = check_model(model, options)
    assert found.passed, found.error
    assert set(found.runtimes) == {"1.13.1", "2.12.1"}
    tolerance = found.tolerance
    assert tolerance is not None
    for version, record in found.runtimes.items():
        assert record.loads and record.passed, (version, record.error)
        assert record.kernels == "XNNPACK"
        assert record.relative_error is not None and record.relative_error <= tolerance
    assert found.runtimes["2.12.1"].upstream_relative_error is not None
    assert set(found.runtime_ms) == {"eager", "fxmobile", "upstream"}
    assert all(ms > 0 for ms in found.runtime_ms.values())
    assert found.runtime_ratio is not None


@pytest.mark.runtime()
def test_the_cli_runs_a_shard_on_the_runtimes_and_merges_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = quick_models()[0].key
    args = ["--quick", "--models", name, "--runtime", "all", "--rounds", "1", "--min-time", "0"]
    out = tmp_path / "shard"
    assert main([*args, "--shard", "1/1", "--no-compare", "--out", str(out)]) == 0
    doc = json.loads((out / "zoo.json").read_text())
    assert doc["meta"]["runtimes"] == ["1.13.1", "2.12.1"]
    (record,) = doc["results"]
    assert {v: r["passed"] for v, r in record["runtimes"].items()} == {
        "1.13.1": True,
        "2.12.1": True,
    }
    assert merge_main([str(out / "zoo.json"), "--no-compare"]) == 0
    assert "torch 1.13.1: 1/1 files load, 1/1 match eager" in capsys.readouterr().out


@pytest.mark.runtime()
def test_when_upstream_or_the_timing_fails_the_file_is_still_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fxmobile.runtime.errors import RuntimeCrashedError
    from model_zoo_checks import on_runtimes

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeCrashedError("torch 2.12.1's process was killed by SIGKILL")

    monkeypatch.setattr(on_runtimes, "against_upstream", crash)
    options = RunOptions(rounds=1, min_time=0.0, runtimes=("2.12.1",))
    (found,) = check_model(quick_models()[0], options)
    record = found.runtimes["2.12.1"]
    assert record.loads and record.passed
    assert found.runtime_ms == {}
    assert any("SIGKILL" in note for note in found.notes)


# --- the journal: a killed run goes on where it stopped ---------------------------------------


def test_the_journal_records_each_model_and_a_resumed_run_skips_them(tmp_path: Path) -> None:
    from model_zoo_checks.journal import Journal
    from model_zoo_checks.runner import run_zoo

    path = tmp_path / "journal.jsonl"
    entries = [entry("a"), entry("b"), entry("c")]
    checked: list[str] = []

    def check(model: ZooModel, options: RunOptions) -> list[ModelResult]:
        checked.append(model.key)
        return [result(key=model.key, name=model.key)]

    journal = Journal(path)
    run_zoo(entries[:2], RunOptions(), check=check, on_model=journal.append)
    with path.open("a") as f:
        f.write('[{"key": "c", "cut short by the kill')  # the line being written when killed
    again = Journal(path, resume=True)
    assert again.keys == {"a", "b"}
    assert [r.key for r in again.results_for(entries)] == ["a", "b"]
    assert path.read_text().count("\n") == 2  # the cut line is gone before anything is added
    todo = [e for e in entries if e.key not in again.keys]
    run_zoo(todo, RunOptions(), check=check, on_model=again.append)
    assert checked == ["a", "b", "c"]
    assert Journal(path, resume=True).keys == {"a", "b", "c"}
    assert Journal(path).keys == set() and path.read_text() == ""  # no --resume: a fresh run


def test_a_journal_line_of_another_format_is_run_again(tmp_path: Path) -> None:
    """A journal left by an older runner (a line that is valid JSON but misses a field this
    runner needs) is resumed, not crashed on: that model runs again."""
    from model_zoo_checks.journal import Journal

    path = tmp_path / "journal.jsonl"
    Journal(path).append([result(key="a", name="a")])
    with path.open("a") as f:
        f.write(json.dumps([{"key": "b", "name": "b"}]) + "\n")  # no status
        f.write(json.dumps({"key": "c"}) + "\n")  # not a list of results
    again = Journal(path, resume=True)
    assert again.keys == {"a"}
    assert path.read_text().count("\n") == 1


def test_resume_needs_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--resume"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err
