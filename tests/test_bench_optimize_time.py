"""The optimize-time benchmark's stopwatch still finds every function it times (a rename in
fxmobile once broke it silently: nothing runs the benchmark in make test)."""

from __future__ import annotations

from collections import defaultdict

from benchmarks.bench_optimize_time import STAGES, stopwatch


def test_every_timed_stage_exists_and_the_stopwatch_restores_it() -> None:
    import importlib

    owners = [importlib.import_module(module) for module, _, _ in STAGES]
    before = [getattr(owner, attr) for owner, (_, attr, _) in zip(owners, STAGES, strict=True)]
    spent: dict[str, float] = defaultdict(float)
    with stopwatch(spent):
        during = [getattr(o, attr) for o, (_, attr, _) in zip(owners, STAGES, strict=True)]
    after = [getattr(owner, attr) for owner, (_, attr, _) in zip(owners, STAGES, strict=True)]
    assert all(d is not b for d, b in zip(during, before, strict=True))
    assert after == before
