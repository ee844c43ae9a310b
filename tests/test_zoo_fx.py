"""Every torchvision classification model through the FX stage (slow: `make test-slow`).

Random weights, BatchNorm statistics randomized by training-mode forwards; the optimized graph
must match eager within 1e-4 of the output's scale, the BN-heavy families must lose every
BatchNorm, and the original model must be bit-identical afterwards.
"""

from __future__ import annotations

import pytest

from model_zoo_checks.fx_check import TOLERANCE, check_fx, run_guarded
from model_zoo_checks.zoo import BN_FREE_FAMILIES, GIANTS, classification_models

MODELS = classification_models()


@pytest.mark.slow
@pytest.mark.parametrize("entry", MODELS, ids=[m.name for m in MODELS])
def test_zoo_model_through_fx_stage(entry: object) -> None:
    from model_zoo_checks.zoo import ZooModel

    assert isinstance(entry, ZooModel)
    result = run_guarded(entry) if entry.name in GIANTS else check_fx(entry)
    assert result.relative_error <= TOLERANCE, result
    assert result.original_unchanged, result
    if entry.family in BN_FREE_FAMILIES:
        assert result.batchnorm_left == 0, result


def test_catalogue_has_the_whole_classification_zoo() -> None:
    assert len(MODELS) == 80
    assert {m.family for m in MODELS} >= set(BN_FREE_FAMILIES)
