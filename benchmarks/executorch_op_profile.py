"""Per-op profile of ExecuTorch programs in this process, from their ETDumps, side by side.

Why: ``bench_executorch.py`` says which of two programs of a model is faster; this says where
the difference lies: more delegate calls, an op left on a portable kernel, or a slower XNNPACK
kernel kind.

How: every program is loaded with ETDump on (``Runtime.load_program(..., enable_etdump=True)``)
on the thread pool the caller sized, all are run on the same inputs in interleaved rounds (each
round runs each program once, in a fresh random order; the first ``warmup`` runs are dropped),
and each program's ETDump is read by ``executorch.devtools.Inspector``. ExecuTorch 1.5.1's pip
runtime is built with its event tracer, and in this process too its XNNPACK delegate logs one
event per XNNPACK operator (``Convolution (NHWC, F32) IGEMM #3``), so a profile holds:

- each XNNPACK operator kind, its number ``#n`` dropped; XNNPACK reports each operator in whole
  microseconds, truncated, so a tiny operator reads 0 and the kinds sum to a little under
  ``DELEGATE_CALL`` (the rest is the delegate's own work around them);
- each op outside the delegate, on its portable kernel (``native_call_cumsum.out`` reads
  ``cumsum.out``; the ``OPERATOR_CALL`` event around it is not counted twice);
- the spans: each ``DELEGATE_CALL`` and the whole ``Method::execute``.

No ETRecord is made (the programs come as bytes), so the Inspector names no backend for an event:
``is_delegated_op`` says which ran inside the delegate. Per op kind: calls per run, and the
median over the profiled runs of that kind's total time in one run (medians of sums do not add
up: the two ``sum`` rows are medians of their own).
"""

from __future__ import annotations

import random
import re
import statistics
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from fxmobile.executorch.runtime import program_inputs

SPANS = ("Method::execute", "DELEGATE_CALL")
XNNPACK_SUM = "XNNPACK operators, sum"
PORTABLE_SUM = "portable ops, sum"
# Where an op kind runs: the runtime's own spans, inside the delegate, on a portable kernel
WHERE = {"span": "runtime", "delegated": "XNNPACK", "portable": "portable", "sum": "sum"}
_PORTABLE_PREFIX = "native_call_"


@dataclass(frozen=True)
class OpKind:
    """One op kind in one program: where it runs, its calls per run, its median us per run."""

    where: str
    calls: int
    us: float


Profile = dict[str, OpKind]  # op kind -> its figures


def op_kind(event_name: str) -> str:
    """An event's op kind: ``Convolution (NHWC, F32) DWConv #3`` loses its number,
    ``native_call_add.out`` its prefix."""
    return re.sub(r" #\d+$", "", event_name).removeprefix(_PORTABLE_PREFIX)


def aggregate(events: Iterable[tuple[str, bool, Sequence[float]]]) -> Profile:
    """The profile of one program from its events, each ``(name, ran in the delegate, its
    microseconds in each profiled run)``: per op kind, the calls per run and the median over the
    runs of the kind's time in a run; the spans keep their names, and two ``sum`` rows add up
    the XNNPACK operators and the portable ops of each run."""
    per_run: dict[str, list[float]] = {}
    calls: dict[str, int] = {}
    where: dict[str, str] = {}
    runs: int | None = None

    def add(key: str, place: str, times: Sequence[float]) -> None:
        before = per_run.get(key, [0.0] * len(times))
        per_run[key] = [a + b for a, b in zip(before, times, strict=True)]
        calls[key] = calls.get(key, 0) + 1
        where[key] = place

    for name, delegated, times in events:
        if runs is None:
            runs = len(times)
        if len(times) != runs or not times:
            raise ValueError(
                f"event {name!r} has {len(times)} times, the first event had {runs}: every event "
                f"of a profile needs one time per profiled run"
            )
        if name in SPANS:
            add(name, WHERE["span"], times)
        elif delegated:
            add(op_kind(name), WHERE["delegated"], times)
            add(XNNPACK_SUM, WHERE["sum"], times)
        elif name.startswith(_PORTABLE_PREFIX):
            add(op_kind(name), WHERE["portable"], times)
            add(PORTABLE_SUM, WHERE["sum"], times)
        else:  # an event this module does not know: shown as it came
            add(name, WHERE["span"], times)
    return {key: OpKind(where[key], calls[key], statistics.median(per_run[key])) for key in per_run}


def events_of(inspector: Any, warmup: int) -> list[tuple[str, bool, list[float]]]:
    """The events of an Inspector's one ``Execute`` block, as ``aggregate`` takes them, with
    the first ``warmup`` runs dropped."""
    blocks = [block for block in inspector.event_blocks if block.name == "Execute"]
    if len(blocks) != 1:  # the Inspector groups runs by their events: every run should match
        raise RuntimeError(f"{len(blocks)} groups of runs in the ETDump, expected 1")
    return [
        (event.name, bool(event.is_delegated_op), list(event.perf_data.raw[warmup:]))
        for event in blocks[0].events
        # OPERATOR_CALL wraps each native_call_* event: the kernel is counted, not twice
        if event.perf_data is not None and event.name != "OPERATOR_CALL"
    ]


def profile(
    programs: Mapping[str, bytes],
    inputs: tuple[Any, ...],
    runs: int = 10,
    warmup: int = 2,
    seed: int = 0,
) -> dict[str, Profile]:
    """Each program's profile over ``runs`` interleaved runs on ``inputs`` (the model's own
    arguments), on the XNNPACK thread pool as it is sized now. The programs are loaded here and
    released before returning: ``set_threads`` frees the pool they would point to."""
    from executorch.devtools import Inspector
    from executorch.devtools.inspector import TimeScale
    from executorch.runtime import Runtime

    if runs < 1:
        raise ValueError(f"runs={runs}: profile at least one run")
    flat = [x.contiguous() for x in program_inputs(inputs)]
    loaded = {
        name: Runtime.get().load_program(buffer, enable_etdump=True)
        for name, buffer in programs.items()
    }
    methods = {name: program.load_method("forward") for name, program in loaded.items()}
    rng = random.Random(seed)
    for _ in range(warmup + runs):
        for name in rng.sample(list(methods), len(methods)):
            methods[name].execute(flat)
    profiles = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, program in loaded.items():
            etdump = Path(tmp) / f"{name}.etdp"
            program.write_etdump_result_to_file(str(etdump), str(Path(tmp) / f"{name}.bin"))
            with warnings.catch_warnings():  # no tensor data was asked for: only times
                warnings.filterwarnings("ignore", "Output Buffer not found", UserWarning)
                inspector = Inspector(etdump_path=str(etdump), target_time_scale=TimeScale.US)
            profiles[name] = aggregate(events_of(inspector, warmup))
    return profiles


def has_operator_events(found: Profile) -> bool:
    """Whether the delegate logged its operators: false for a runtime built without XNNPACK's
    operator profiling, whose profile holds only the spans and the portable ops."""
    return XNNPACK_SUM in found or "DELEGATE_CALL" not in found


def side_by_side(first: Profile, second: Profile, labels: tuple[str, str]) -> str:
    """One row per op kind of either program: where it runs, and each program's calls per run
    and median us per run, then second - first. The spans and sums come first, then the op
    kinds, the largest difference first."""
    totals = [key for key in (*SPANS, XNNPACK_SUM, PORTABLE_SUM) if key in first or key in second]
    kinds = {*first, *second} - set(totals)

    def difference(key: str) -> float:
        return (second[key].us if key in second else 0.0) - (first[key].us if key in first else 0.0)

    rows = []
    for key in [*totals, *sorted(kinds, key=lambda k: (-abs(difference(k)), k))]:
        here = first.get(key) or second[key]
        cells = [
            cell
            for found in (first, second)
            for cell in ((found[key].calls, f"{found[key].us:.0f}") if key in found else ("-", "-"))
        ]
        rows.append([key, here.where, *cells, f"{difference(key):+.0f}"])
    a, b = labels
    headers = ["op", "runs in", f"{a} calls", f"{a} us", f"{b} calls", f"{b} us", f"{b} - {a} us"]
    return tabulate(rows, headers=headers, disable_numparse=True)
