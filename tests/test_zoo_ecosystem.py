"""Models from the ecosystems users bring, through ``fxmobile.optimize`` with the defaults.

ultralytics YOLOv8n and YOLO11n, eight Hugging Face transformers vision models and three
segmentation_models_pytorch models, each built from its config as a user builds it (random
weights, nothing downloaded, no wrapper; see ``model_zoo_checks.ecosystem``). Issue 12's target:
every one optimizes with the defaults, matches eager within 1e-4 of the output's scale, leaves
the original untouched, and leaves no ``aten::batch_norm`` and no unprepacked convolution in the
frozen graph. Each model runs in its own child process under the memory guard.

The slow tests need the ``ecosystem`` extra (``pip install -e '.[ecosystem]'``) and are skipped,
saying so, without it.
"""

from __future__ import annotations

import importlib.util

import pytest

from model_zoo_checks.ecosystem import ecosystem_models
from model_zoo_checks.inventory import TOLERANCE, probe_guarded
from model_zoo_checks.zoo import Kind, all_models

MODELS = ecosystem_models()
EXTRA = ("ultralytics", "transformers", "segmentation_models_pytorch")
MISSING = [name for name in EXTRA if importlib.util.find_spec(name) is None]


@pytest.mark.slow
@pytest.mark.skipif(
    bool(MISSING), reason=f"needs the ecosystem extra (pip install -e '.[ecosystem]'): {MISSING}"
)
@pytest.mark.parametrize("entry", MODELS, ids=[m.key for m in MODELS])
def test_ecosystem_model_optimizes_fully_with_defaults(entry: object) -> None:
    from model_zoo_checks.zoo import ZooModel

    assert isinstance(entry, ZooModel)
    record = probe_guarded(entry, routes=("defaults",))
    assert "error" not in record, record  # built, and its child neither hung nor died
    route = record["routes"]["defaults"]
    assert "error" not in route, route
    assert route["untouched"], route
    assert route["relative_error"] <= TOLERANCE, route
    assert route["ops_left"] == {}, route  # no batch_norm, no unprepacked convolution


def test_catalogue_has_each_ecosystem() -> None:
    families = {m.family for m in MODELS}
    assert families == {"ultralytics", "transformers", "smp"}
    assert {"ultralytics:yolov8n", "ultralytics:yolo11n"} <= {m.key for m in MODELS}
    assert sum(m.family == "transformers" for m in MODELS) == 8
    assert [m for m in all_models() if m.kind is Kind.ECOSYSTEM] == MODELS


def test_a_run_refuses_before_its_first_model_when_a_package_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # bench_executorch measured for 40 minutes, then stopped at its first transformers model
    # for want of the package; the zoo would have recorded every such model as an error
    from model_zoo_checks import ecosystem, run

    # only transformers is missing, whatever this venv holds
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else name
    )

    def no_run(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(run, "run_zoo", no_run)
    argv = ["--models", "resnet18", "transformers:deit", "smp:fpn_efficientnet-b0"]
    assert run.main([*argv, "--no-compare"]) == 2
    assert f"need transformers: {ecosystem.INSTALL}" in capsys.readouterr().err
