"""timm's models through ``fxmobile.optimize`` with the defaults: issue 12's target.

Every catalogue model (``--kind timm``: each mobile-class family and a seeded sample of 110 other
architectures under 60M parameters; see ``model_zoo_checks.timm_models``) must either optimize
with the defaults and match eager within 1e-4 of the output's scale, leaving the original
untouched, or be refused with a clean ``FxMobileError``; at least 98% must optimize. Each model
runs in its own child process under the memory guard (``model_zoo_checks.inventory``).

The slow tests run with ``make test-slow`` or ``pytest -m slow tests/test_zoo_timm.py``; the
catalogue checks run in ``make test``.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from model_zoo_checks.inventory import TOLERANCE, probe_guarded
from model_zoo_checks.timm_models import (
    MOBILE,
    PREFIX,
    REPARAMETERIZABLE,
    REPARAMETERIZED,
    SAMPLE,
    sample_names,
    timm_models,
)
from model_zoo_checks.zoo import Kind, all_models

MODELS = timm_models()
BY_KEY = {m.key: m for m in MODELS}
SHARE_THAT_MUST_OPTIMIZE = 0.98


@functools.cache
def defaults(key: str) -> dict[str, Any]:
    """The ``defaults`` route's record of one model (run once per session)."""
    return probe_guarded(BY_KEY[key], routes=("defaults",))


def optimized(record: dict[str, Any]) -> bool:
    route = record.get("routes", {}).get("defaults", {})
    return route.get("outcome") == "ok" and route.get("untouched", False)


@pytest.mark.slow
@pytest.mark.parametrize("key", list(BY_KEY))
def test_timm_model_optimizes_with_defaults_or_is_refused_cleanly(key: str) -> None:
    record = defaults(key)
    assert "error" not in record, record  # built, and its child neither hung nor died
    route = record["routes"]["defaults"]
    assert route["untouched"], record
    if "error" in route:
        assert route["fxmobile_error"], route  # refused on purpose, with fxmobile's error
        assert "INTERNAL ASSERT" not in route["error"], route
    else:
        assert route["relative_error"] <= TOLERANCE, route


@pytest.mark.slow
def test_at_least_98_percent_of_timm_models_optimize_with_defaults() -> None:
    failed = [key for key in BY_KEY if not optimized(defaults(key))]
    assert len(failed) <= (1 - SHARE_THAT_MUST_OPTIMIZE) * len(MODELS), failed


@pytest.mark.slow
def test_sample_is_the_seeded_draw_over_this_timm() -> None:
    assert tuple(sample_names()) == SAMPLE


def test_catalogue_has_every_mobile_family_and_the_sample() -> None:
    families = {family for family, _ in MOBILE}
    required = {
        "mobilenetv2", "mobilenetv3", "efficientnet", "efficientnet_lite", "tf_efficientnet_lite",
        "mnasnet", "fbnet", "mixnet", "ghostnet", "lcnet", "hardcorenas", "tinynet", "rexnet",
        "repvgg", "mobileone", "fastvit", "efficientvit", "mobilevit", "levit",
        "efficientformer", "efficientformerv2", "regnet", "resnet_d", "dla", "convnext",
    }  # fmt: skip
    assert required <= families
    mobile = {name for _, name in MOBILE}
    assert len(SAMPLE) >= 100 and len(set(SAMPLE)) == len(SAMPLE)
    assert not mobile & set(SAMPLE)
    keys = [m.key for m in MODELS]
    assert len(keys) == len(MOBILE) + len(REPARAMETERIZABLE) + len(SAMPLE) == len(set(keys))
    assert all(k.startswith(PREFIX) for k in keys)
    assert sum(k.endswith(REPARAMETERIZED) for k in keys) == len(REPARAMETERIZABLE)
    assert all(m.kind is Kind.TIMM and m.input_shape[:2] == (1, 3) for m in MODELS)
    assert [m for m in all_models() if m.kind is Kind.TIMM] == MODELS


def test_timm_and_ecosystem_run_only_when_selected() -> None:
    from model_zoo_checks.run import select

    catalogue = all_models()
    assert not [m for m in select(catalogue) if m.kind in (Kind.TIMM, Kind.ECOSYSTEM)]
    assert select(catalogue, kinds=["timm"]) == MODELS
    assert [m.key for m in select(catalogue, models=["timm:levit_128s"])] == ["timm:levit_128s"]
