"""compare_latency: candidates in this process and in runtime processes, interleaved.

No timed assertions: the bookkeeping is checked on candidates that report scripted times, and
the real candidates only for counts, labels and positive figures.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
import torch
import torch.jit.mobile

import fxmobile
from fxmobile.errors import InvalidValueError
from fxmobile.runtime import RuntimeProcess
from fxmobile.runtime.latency import Candidate, Here, OnRuntime, compare_latency, latency_table
from fxmobile.runtime.samples import sample_file

Runtime = Callable[[str], RuntimeProcess]


class Scripted:
    """Reports the next of its scripted times for each call, and logs when it was asked."""

    def __init__(self, name: str, times: list[float], log: list[str]) -> None:
        self.name = name
        self.times = list(times)
        self.log = log
        self.runs_on = f"{name}'s process"
        self.kernels = f"{name}'s kernels"

    def time(self, n: int) -> list[float]:
        self.log.append(self.name)
        taken, self.times = self.times[:n], self.times[n:]
        return taken


def test_summaries_are_of_the_timed_calls_only() -> None:
    log: list[str] = []
    a = Scripted("a", [99.0, 99.0, *[float(i) for i in range(1, 11)]], log)  # 2 warmup calls
    b = Scripted("b", [99.0, 99.0, *[2.0] * 10], log)
    found = compare_latency({"a": a, "b": b}, rounds=5, calls=2, warmup=2)
    assert found["a"].timing.runs == 10
    assert found["a"].timing.median_ms == 5.5  # of 1..10; the warm-up 99s are left out
    assert found["a"].timing.p10_ms == 2.0
    assert found["b"].timing.median_ms == 2.0
    assert (found["a"].runs_on, found["a"].kernels) == ("a's process", "a's kernels")


def test_order_is_shuffled_each_round() -> None:
    log: list[str] = []
    names = "abcd"
    candidates = {n: Scripted(n, [1.0] * 40, log) for n in names}
    compare_latency(candidates, rounds=8, warmup=0, seed=1)
    rounds = ["".join(log[i : i + 4]) for i in range(0, len(log), 4)]
    assert all(sorted(r) == list(names) for r in rounds)  # each candidate once per round
    assert len(set(rounds)) > 1


def test_here_counts_its_calls() -> None:
    calls: list[int] = []

    def identity(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return x

    candidate = Here(identity, [torch.ones(1)], "ATen")
    found = compare_latency({"here": candidate}, rounds=3, calls=2, warmup=1)
    assert len(calls) == 1 + 3 * 2
    assert found["here"].timing.runs == 6
    assert found["here"].runs_on.startswith("torch 2.15.0")


def test_min_time_fills_rounds_from_the_warmup_estimate_within_bounds() -> None:
    log: list[str] = []
    # one warm-up call each (10 ms + 15 ms): a round is 25 ms, 0.1 s fills 4 rounds
    a = Scripted("a", [10.0] + [1.0] * 100, log)
    b = Scripted("b", [15.0] + [1.0] * 100, log)
    found = compare_latency({"a": a, "b": b}, rounds=2, warmup=1, min_time=0.1)
    assert found["a"].timing.runs == 4
    capped = {n: Scripted(n, [0.001] + [1.0] * 100, log) for n in "ab"}
    found = compare_latency(capped, rounds=2, warmup=0, min_time=1.0, max_rounds=7)
    assert found["a"].timing.runs == 7  # min_time warms up once even with warmup=0
    slow = {n: Scripted(n, [900.0] + [1.0] * 10, log) for n in "ab"}
    assert compare_latency(slow, rounds=3, warmup=1, min_time=1.0)["b"].timing.runs == 3


@pytest.mark.parametrize(
    "bad",
    [{"rounds": 0}, {"calls": 0}, {"warmup": -1}, {"min_time": -1.0}, {"max_rounds": 1}],
)
def test_bad_settings_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(InvalidValueError, match="at least"):
        compare_latency({"x": Here(lambda: None, [], "none")}, **bad)


@pytest.mark.runtime()
def test_candidates_in_three_processes_interleave(runtime: Runtime) -> None:
    data, inputs = sample_file()
    fxmobile.registration_status()
    module = torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(data))
    here = Here(module, inputs, "fxmobile._C")
    loaded = {v: runtime(v).load(data) for v in ("1.13.1", "2.12.1")}
    candidates: dict[str, Candidate] = {
        "here": here,
        **{f"on {v}": OnRuntime(f, inputs) for v, f in loaded.items()},
    }
    found = compare_latency(candidates, rounds=4, calls=2, warmup=1)
    for f in loaded.values():
        f.close()
    assert all(r.timing.runs == 8 and r.timing.p10_ms > 0 for r in found.values())
    assert found["on 2.12.1"].runs_on == "torch 2.12.1 (reference runtime)"
    assert found["on 2.12.1"].kernels == "XNNPACK"
    rows = latency_table(found).splitlines()
    assert "speed-up vs here" in rows[0]
    assert rows[3].split()[:5] == ["on", "1.13.1", "torch", "1.13.1", "(reference"]
