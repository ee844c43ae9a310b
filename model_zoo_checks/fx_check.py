"""Check the FX stage on one zoo model: numerics, BatchNorm left, the original untouched.

``python -m model_zoo_checks.fx_check NAME`` prints the result as JSON, so giant models can run
one per process under a memory guard (see ``run_guarded``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch
from torch import nn

import fxmobile
from fxmobile.verify import randomize_batchnorm_statistics
from model_zoo_checks.guard import run_json_guarded
from model_zoo_checks.zoo import ZooModel

TOLERANCE = 1e-4  # max abs error relative to max |eager output|


@dataclass
class FxCheck:
    """One model through ``fxmobile.optimize_fx``, as plain data (the child prints it as JSON).

    ``relative_error`` is the largest over the outputs (a report without numerics raises),
    ``batchnorm_left`` the BatchNorm modules still called in the graph, ``original_unchanged``
    whether the model's state (values, dtypes, strides) and training flags are exactly as before,
    ``seconds`` the wall time of ``optimize_fx``, ``rewrites`` the report's rewrite count.
    """

    name: str
    relative_error: float
    batchnorm_left: int
    original_unchanged: bool
    seconds: float
    rewrites: int


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def check_fx(entry: ZooModel) -> FxCheck:
    """Run ``entry``'s FX stage in this process and check it (seeded: torch's global seed 0).

    The model has its BatchNorm statistics randomized first. The optimization's own check runs at
    ``TOLERANCE`` and raises ``NumericalMismatchError`` on a mismatch, so a returned
    ``relative_error`` is within it.
    """
    torch.manual_seed(0)
    model = randomize_batchnorm_statistics(entry.build(), entry.input_shape)
    before = _snapshot(model)
    flags = [m.training for m in model.modules()]
    x = torch.randn(entry.input_shape)
    start = time.perf_counter()
    result = fxmobile.optimize_fx(model, x, tolerance=TOLERANCE)
    seconds = time.perf_counter() - start
    after = model.state_dict(keep_vars=True)
    unchanged = (
        before.keys() == after.keys()
        and all(
            torch.equal(before[k], after[k])
            and before[k].dtype == after[k].dtype
            and before[k].stride() == after[k].stride()
            for k in before
        )
        and flags == [m.training for m in model.modules()]
    )
    numerics = result.report.numerics or []
    if not numerics:  # example inputs were given: a check that did not run must not read as 0
        raise RuntimeError(f"{entry.name}: optimize_fx ran no numerical check")
    gm = result.graph_module
    bn_left = sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_module"
        and isinstance(gm.get_submodule(n.target), nn.modules.batchnorm._BatchNorm)
    )
    return FxCheck(
        name=entry.name,
        relative_error=max((c.relative_error for c in numerics), default=0.0),
        batchnorm_left=bn_left,
        original_unchanged=unchanged,
        seconds=seconds,
        rewrites=result.report.rewrites,
    )


def run_guarded(entry: ZooModel, limit_gib: float = 20.0, timeout: float = 1800) -> FxCheck:
    """``check_fx`` in a child process under the memory guard (see ``model_zoo_checks.guard``)."""
    cmd = [sys.executable, "-m", "model_zoo_checks.fx_check", entry.name]
    return FxCheck(**run_json_guarded(cmd, limit_gib, timeout, entry.name))


def main() -> None:
    """The child of ``run_guarded``: check the classification model named in ``sys.argv[1]``
    and print the ``FxCheck`` as one JSON line. Threads: ``FXMOBILE_THREADS``, default 2."""
    from model_zoo_checks.zoo import classification_models

    by_name = {m.name: m for m in classification_models()}
    torch.set_num_threads(int(os.environ.get("FXMOBILE_THREADS", "2")))
    print(json.dumps(asdict(check_fx(by_name[sys.argv[1]]))))


if __name__ == "__main__":
    main()
