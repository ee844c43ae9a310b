"""The zoo regression runner: baseline comparison, writers, catalogue, and real runs.

The comparison is tested on synthetic results (each regression kind, improvements, the noise
margin, new models); a planted regression then runs the real runner on resnet18 at 64x64 against
a baseline that records better figures than reality, or with a pass blocklisted, and checks the
run exits nonzero naming the regression. The quick subset runs against the committed baseline.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from model_zoo_checks import baseline as bl
from model_zoo_checks.guard import GuardError, run_json_guarded
from model_zoo_checks.output import plot_speedups, render_markdown, render_table, write_outputs
from model_zoo_checks.results import ModelResult, Status
from model_zoo_checks.run import main, select
from model_zoo_checks.runner import Progress, RunOptions, run_zoo, same_top5
from model_zoo_checks.zoo import GIANTS, Kind, Route, ZooModel, all_models, quick_models


@pytest.fixture(autouse=True)
def _keep_torch_threads() -> Any:
    """The runner sets torch's thread count; give the next test module the one it had."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def result(**changes: Any) -> ModelResult:
    """A passing CPU result of a made-up model; ``changes`` override fields."""
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
        unfused_by_op={"aten::add": 4, "aten::relu": 6},
        file_bytes=1000,
        optimize_seconds=1.0,
        eager_ms=10.0,
        optimized_ms=5.0,
    )
    return dataclasses.replace(base, **changes)


def baseline_of(*results: ModelResult) -> bl.Baseline:
    return bl.merged({}, results)


def metrics(regressions: list[bl.Regression]) -> list[str]:
    return [r.metric.value for r in regressions]


# --- comparison on synthetic results ---------------------------------------------------------


def test_same_results_do_not_regress() -> None:
    assert bl.compare([result()], baseline_of(result())) == []


def test_a_model_that_passed_and_now_raises_regresses() -> None:
    new = result(status=Status.ERROR, error="CaptureError: boom", relative_error=None)
    (found,) = bl.compare([new], baseline_of(result()))
    assert found.metric is bl.Metric.STATUS
    assert str(found) == "net/cpu: status passed -> error: CaptureError: boom"


def test_a_model_that_now_fails_its_check_regresses() -> None:
    new = result(status=Status.FAILED, error="top-5 indices differ from eager")
    assert metrics(bl.compare([new], baseline_of(result()))) == ["status"]


@pytest.mark.parametrize(
    ("old", "new", "regressed"),
    [
        (1e-6, 2e-5, True),  # 20x and above the floor (1e-5)
        (1e-6, 9e-6, False),  # 9x
        (1e-7, 9e-6, False),  # 90x, but below the floor: float noise
        (2e-5, 1.5e-4, True),  # 7.5x, but past the tolerance 1e-4
        (1e-5, 9e-5, False),  # 9x, within the tolerance
        (5e-3, 6e-3, False),  # a known failure, barely worse
        (5e-3, 6e-2, True),  # a known failure, 12x worse
        (1e-5, 1e-7, False),  # an improvement
    ],
)
def test_relative_error_bound(old: float, new: float, regressed: bool) -> None:
    found = bl.compare([result(relative_error=new)], baseline_of(result(relative_error=old)))
    assert ("relative_error" in metrics(found)) is regressed, found


def test_error_growth_and_floor_are_configurable() -> None:
    old, new = baseline_of(result(relative_error=1e-6)), [result(relative_error=2e-5)]
    assert bl.compare(new, old, bl.Thresholds(error_growth=100)) == []
    tiny_old, tiny_new = baseline_of(result(relative_error=1e-8)), [result(relative_error=5e-7)]
    assert bl.compare(tiny_new, tiny_old) == []  # 50x, but below the floor
    assert metrics(bl.compare(tiny_new, tiny_old, bl.Thresholds(error_floor=0))) == [
        "relative_error"
    ]
    assert bl.Thresholds().error_bound(1e-6, 1e-4) == pytest.approx(1e-5)


def test_more_unfused_ops_regress_and_name_the_ops_that_grew() -> None:
    new = result(unfused_ops=11, unfused_by_op={"aten::add": 5, "aten::relu": 6})
    (found,) = bl.compare([new], baseline_of(result()))
    assert (found.metric, found.old, found.new) == (bl.Metric.UNFUSED_OPS, 10, 11)
    assert "aten::add 4->5" in str(found)


def test_latency_noise_margin() -> None:
    old = baseline_of(result())  # ratio 0.5
    assert bl.compare([result(optimized_ms=6.0)], old) == []  # 0.6: 20% worse, within 25%
    (found,) = bl.compare([result(optimized_ms=6.5)], old)  # 0.65: 30% worse
    assert found.metric is bl.Metric.LATENCY_RATIO
    assert found.bound == pytest.approx(0.625)
    assert bl.compare([result(optimized_ms=6.5)], old, bl.Thresholds(latency_margin=0.5)) == []


def test_improvements_are_not_regressions() -> None:
    old = baseline_of(result(status=Status.FAILED, error="relative error 2e-4 > 1e-4"))
    better = result(relative_error=1e-8, unfused_ops=3, optimized_ms=1.0, file_bytes=10)
    assert bl.compare([better], old) == []


def test_new_and_not_run_models_are_not_regressions() -> None:
    old = baseline_of(result())
    new_model = result(key="other", name="other")
    skipped = result(status=Status.SKIPPED, relative_error=None, unfused_ops=None)
    assert bl.compare([new_model, skipped], old) == []
    assert bl.not_in_baseline([new_model, skipped], old) == ["other/cpu"]


def test_a_known_failure_that_still_fails_is_not_a_regression() -> None:
    failing = result(status=Status.ERROR, error="PassError: x", relative_error=None)
    assert bl.compare([failing], baseline_of(failing)) == []


def test_backends_are_compared_separately() -> None:
    old = baseline_of(result(), result(backend="vulkan", unfused_ops=20, eager_ms=None))
    new = [result(unfused_ops=12), result(backend="vulkan", unfused_ops=20, eager_ms=None)]
    (found,) = bl.compare(new, old)
    assert (found.key, found.backend) == ("net", "cpu")


def test_merge_replaces_what_ran_and_keeps_the_rest(tmp_path: Path) -> None:
    old = baseline_of(result(), result(key="other", name="other"))
    rerun = result(unfused_ops=7, eager_ms=None, optimized_ms=None)  # no latency this time
    giant = result(key="other", name="other", status=Status.SKIPPED, unfused_ops=None)
    new = bl.merged(old, [rerun, giant])
    assert new["net/cpu"].unfused_ops == 7
    assert new["net/cpu"].latency_ratio == 0.5  # kept from the old baseline
    assert new["other/cpu"] == old["other/cpu"]
    path = tmp_path / "baseline.json"
    bl.save(new, path)
    assert bl.load(path) == new
    assert bl.load(tmp_path / "missing.json") == {}
    path.write_text(json.dumps({"version": 0, "entries": {}}))
    with pytest.raises(ValueError, match="--update-baseline"):
        bl.load(path)


# --- writers -------------------------------------------------------------------------------


def test_json_and_markdown_writers(tmp_path: Path) -> None:
    results = [result(), result(key="bad", name="bad", status=Status.ERROR, error="E: x")]
    regressions = bl.compare(results, baseline_of(result(key="bad", name="bad")))
    paths = write_outputs(tmp_path / "out", results, regressions, {"rounds": 3})
    assert [p.name for p in paths] == ["zoo.json", "zoo.md"]
    data = json.loads(paths[0].read_text())
    assert data["meta"] == {"rounds": 3}
    assert [ModelResult.from_dict(r) for r in data["results"]] == results
    assert data["results"][0]["latency_ratio"] == 0.5
    assert data["regressions"][0]["metric"] == "status"
    markdown = paths[1].read_text()
    assert markdown == render_markdown(results, regressions, {"rounds": 3})
    assert "| net " in markdown and "2.00x" in markdown
    assert "- bad/cpu: status passed -> error: E: x" in markdown
    assert "- bad/cpu: error: E: x" in markdown
    table = render_table(results)
    assert "speedup" in table.splitlines()[0] and "error" in table


def test_plot_without_matplotlib_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    message = plot_speedups([result()], tmp_path / "speedup.png")
    assert "matplotlib is not installed" in message
    assert not (tmp_path / "speedup.png").exists()
    assert "no model was timed" in plot_speedups([result(eager_ms=None)], tmp_path / "x.png")


def test_plot_writes_a_png_with_matplotlib(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "speedup.png"
    message = plot_speedups([result(), result(key="b", name="b", optimized_ms=4.0)], path)
    assert str(path) in message
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- catalogue and selection ---------------------------------------------------------------

CATALOGUE = all_models()


def test_catalogue_has_every_kind() -> None:
    kinds = {k: [m for m in CATALOGUE if m.kind is k] for k in Kind}
    assert len(kinds[Kind.CLASSIFICATION]) == 80
    assert all(kinds.values())
    assert len({m.key for m in CATALOGUE}) == len(CATALOGUE)
    assert all(len(m.input_shape) == 5 for m in kinds[Kind.VIDEO])
    assert {m.name for m in CATALOGUE if m.giant} == GIANTS


def test_detectors_that_cannot_be_taken_say_why() -> None:
    detection = [m for m in CATALOGUE if m.kind is Kind.DETECTION]
    whole = [m for m in detection if not m.name.endswith("_core")]
    assert whole and all(m.unsupported and "lite interpreter" in m.unsupported for m in whole)
    assert all(m.route is Route.SCRIPT for m in whole)
    cores = [m for m in detection if m.name.endswith("_core")]
    assert len(cores) == len(whole) and not any(m.unsupported for m in cores)
    assert [m for m in CATALOGUE if m.unsupported] == whole


def test_selection_filters_combine() -> None:
    picked = select(CATALOGUE, families=["resnet"], kinds=["quantized"])
    assert {m.name for m in picked} == {"quantized_resnet18", "quantized_resnet50"}
    assert [m.key for m in select(quick_models(), models=["resnet18"])] == ["resnet18@64x64"]
    with pytest.raises(KeyError, match="did you mean resnet18"):
        select(CATALOGUE, models=["resnet19"])


def test_cli_lists_and_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list", "--kind", "detection"]) == 0
    out = capsys.readouterr().out
    assert "ssd300_vgg16_core" in out and "ImageList" in out
    assert main(["--models", "resnet19"]) == 2
    assert "resnet19" in capsys.readouterr().err


def test_a_model_that_raises_is_recorded_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch
    from torch import nn

    import fxmobile
    from model_zoo_checks import builders

    def tiny(entry: ZooModel) -> nn.Module:
        if entry.name == "resnet18":
            raise RuntimeError("no weights today\nsecond line")
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten())

    real_optimize = fxmobile.optimize

    def optimize(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if isinstance(module, nn.Sequential) and kwargs["backend"] is fxmobile.Backend.METAL:
            raise fxmobile.CaptureError("cannot trace\nmore")
        return real_optimize(module, *args, **kwargs)

    monkeypatch.setattr(builders, "build", tiny)
    monkeypatch.setattr(fxmobile, "optimize", optimize)
    entries = [ZooModel("resnet18", Kind.CLASSIFICATION, (1, 3, 8, 8)), *_tiny_entries()]
    lines: list[str] = []
    backends = (fxmobile.Backend.CPU, fxmobile.Backend.VULKAN, fxmobile.Backend.METAL)
    options = RunOptions(backends=backends, rounds=1, warmup=0, threads=1, skip_giants=True)
    results = run_zoo(entries, options, Progress(len(entries), stream=_Lines(lines)))
    assert torch.get_num_threads() == 1
    by_id = {r.id: r for r in results}
    model_lines = [line for line in lines if line.startswith("[")]
    assert len(model_lines) == len(entries) and "elapsed" in model_lines[-1]
    assert any("model" in line and "%" in line for line in lines)  # tqdm's bar, with its ETA
    assert [by_id[f"resnet18/{b.value}"].error for b in backends] == [
        "building: RuntimeError: no weights today"
    ] * 3
    tiny_cpu, tiny_vulkan = by_id["tiny/cpu"], by_id["tiny/vulkan"]
    assert tiny_cpu.passed and tiny_cpu.latency_ratio is not None
    assert tiny_vulkan.passed and tiny_vulkan.eager_ms is None  # latency on the CPU only
    assert by_id["tiny/metal"].status is Status.ERROR
    assert by_id["tiny/metal"].error == "CaptureError: cannot trace"
    assert by_id["vit_h_14/cpu"].status is Status.SKIPPED


def test_a_nan_relative_error_fails_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses as dc

    from torch import nn

    import fxmobile
    from model_zoo_checks import builders

    def tiny(entry: ZooModel) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten())

    real_optimize = fxmobile.optimize

    def optimize(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        """The real result, its check turned NaN (as an output of NaNs against eager would)."""
        result = real_optimize(module, *args, **kwargs)
        report = result.report
        assert report.numerics is not None, "optimize checked no outputs"
        report.numerics = [dc.replace(c, max_abs_error=float("nan")) for c in report.numerics]
        return result

    monkeypatch.setattr(builders, "build", tiny)
    monkeypatch.setattr(fxmobile, "optimize", optimize)
    options = RunOptions(backends=(fxmobile.Backend.CPU,), rounds=0, threads=1, skip_giants=True)
    (checked,) = run_zoo([ZooModel("tiny", Kind.CLASSIFICATION, (1, 3, 8, 8))], options)
    assert checked.relative_error is not None and checked.relative_error != checked.relative_error
    assert checked.status is Status.FAILED and not checked.passed
    assert checked.error is not None and "nan" in checked.error


def _tiny_entries() -> list[ZooModel]:
    return [
        ZooModel("tiny", Kind.CLASSIFICATION, (1, 3, 8, 8)),
        ZooModel("vit_h_14", Kind.CLASSIFICATION, (1, 3, 8, 8)),
    ]


def test_the_guard_reports_a_child_that_dies_or_grows() -> None:
    py = sys.executable
    assert run_json_guarded([py, "-c", "print('[1, 2]')"], 4.0, 60, "ok") == [1, 2]
    with pytest.raises(GuardError, match="killed by SIGABRT"):
        run_json_guarded([py, "-c", "import os; os.abort()"], 4.0, 60, "abort", poll=0.05)
    grow = "import time; x = bytearray(400 * 2**20); time.sleep(30)"
    with pytest.raises(GuardError, match=r"grow: stopped at .* GiB resident \(guard 0.1 GiB\)"):
        run_json_guarded([py, "-c", grow], 0.1, 60, "grow", poll=0.05)


class _Lines:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def write(self, text: str) -> None:
        if text.strip():
            self.lines.append(text)

    def flush(self) -> None:
        pass


def test_same_top5_allows_reordering_among_exact_ties_only() -> None:
    import torch

    eager = torch.tensor([[0.0, 5.0, 5.0, 4.0, 3.0, 2.0, 1.0]])
    assert same_top5(eager, eager.clone())
    swapped = eager[:, [0, 2, 1, 3, 4, 5, 6]]  # the tied 5.0s trade places
    assert same_top5(eager, swapped)
    assert not same_top5(eager, torch.tensor([[9.0, 5.0, 5.0, 4.0, 3.0, 2.0, 1.0]]))


# --- real runs -----------------------------------------------------------------------------

RESNET = ["--quick", "--models", "resnet18@64x64", "--threads", "1"]


@pytest.fixture(scope="module")
def real_baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The baseline of one real run of resnet18 at 64x64, written by --update-baseline."""
    path = tmp_path_factory.mktemp("zoo") / "baseline.json"
    assert main([*RESNET, "--rounds", "2", "--baseline", str(path), "--update-baseline"]) == 0
    return path


def test_planted_regressions_fail_the_run(
    real_baseline: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = json.loads(real_baseline.read_text())
    entry = entries["entries"]["resnet18@64x64/cpu"]
    assert entry["status"] == "passed" and entry["unfused_ops"] > 0
    entry["unfused_ops"] -= 3  # planted better than reality
    entry["relative_error"] /= 1000
    entry["latency_ratio"] /= 10
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps(entries))
    capsys.readouterr()
    code = main([*RESNET, "--rounds", "2", "--baseline", str(planted), "--error-floor", "0"])
    out = capsys.readouterr().out
    assert code == 1
    assert "3 regression(s)" in out
    for metric in ("unfused_ops", "relative_error", "latency_ratio"):
        assert f"resnet18@64x64/cpu: {metric}" in out


def test_a_blocklisted_pass_fails_the_run(
    real_baseline: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    args = [*RESNET, "--rounds", "0", "--baseline", str(real_baseline), "--out", str(tmp_path)]
    assert main([*args, "--blocklist", "INSERT_FOLD_PREPACK_OPS"]) == 1
    out = capsys.readouterr().out
    assert "resnet18@64x64/cpu: unfused_ops" in out and "aten::conv2d 0->20" in out
    regressions = json.loads((tmp_path / "zoo.json").read_text())["regressions"]
    assert [r["metric"] for r in regressions] == ["unfused_ops"]


def test_quick_subset_matches_the_committed_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    """The quick subset in `make test`: status, error and unfused ops against baseline.json
    (latency is left to `make zoo`: a test run on a shared machine is too noisy for it)."""
    code = main(["--quick", "--rounds", "0", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "not in the baseline" not in out, out


def test_no_zoo_model_checks_numerics_on_an_output_of_zeros() -> None:
    """torchvision zero-initializes ViT heads: every output was 0 and every check passed
    whatever the optimized model computed. The zoo gives such layers random weights."""
    import torch

    entry = next(m for m in all_models() if m.name == "vit_b_32")
    model = entry.build_randomized().eval()
    head = model.get_submodule("heads.head")
    assert isinstance(head, torch.nn.Linear) and head.weight.detach().any()
    with torch.no_grad():
        assert model(*entry.example_inputs()).abs().max() > 0


# --- from any directory --------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_build_installs_the_zoo_with_its_baseline() -> None:
    """``python -m model_zoo_checks`` failed outside the repository root: the package was not
    installed (``packages.find`` took ``fxmobile*`` only)."""
    from setuptools.config.pyprojecttoml import read_configuration

    # setuptools' own reading of the file: packages.find expanded into the packages it installs
    config = read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]
    found = config["packages"]
    assert "model_zoo_checks" in found and "fxmobile" in found
    assert not any(name.startswith(("tests", "benchmarks")) for name in found)
    assert "baseline.json" in config["package-data"]["model_zoo_checks"]
    assert (ROOT / "model_zoo_checks" / "baseline.json").is_file()


def test_the_zoo_runs_from_another_directory(tmp_path: Path) -> None:
    """Installed (here: its folder alone on the path, as site-packages holds it), the zoo finds
    its baseline and its worker from any working directory."""
    import os
    import subprocess

    site = tmp_path / "site"
    site.mkdir()
    (site / "model_zoo_checks").symlink_to(ROOT / "model_zoo_checks")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shard = elsewhere / "zoo.json"
    meta = {"shard": "1/1", "thresholds": {}}
    shard.write_text(json.dumps({"meta": meta, "results": [result().to_dict()], "regressions": []}))
    env = {**os.environ, "PYTHONPATH": str(site)}
    for argv in (["--quick", "--list"], ["merge", "zoo.json"]):
        done = subprocess.run(
            [sys.executable, "-m", "model_zoo_checks", *argv],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    assert "net" in done.stdout  # the shard's model, compared with the package's baseline
