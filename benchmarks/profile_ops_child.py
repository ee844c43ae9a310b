"""The reference-runtime half of ``profile_ops.py``: run by path with a runtime venv's python.

It imports nothing but that venv's torch and the standard library (the runtime's torch and
fxmobile's never share a process). It reads a JSON request on stdin: lite-interpreter files to
load, TorchScript files to put through this torch's own ``optimize_for_mobile`` first, and the
input; it times every candidate interleaved (each round runs each candidate once, in a fresh
random order), profiles each one alone with ``torch.profiler`` (per-op self CPU time, as the
lite interpreter dispatches them) and writes a JSON reply on stdout; outputs go to ``outputs``
(``torch.save``) so the parent can check them against eager.
"""

from __future__ import annotations

import io
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.backends.xnnpack
import torch.jit.mobile
from torch.utils.mobile_optimizer import optimize_for_mobile


def load(candidate: dict[str, Any]) -> Callable[..., Any]:
    """A candidate's file in this runtime's lite interpreter. An "upstream" candidate is a
    TorchScript file put through this torch's ``optimize_for_mobile`` first (and saved to its
    ``save_to``, when given, so the parent can count its bytecode)."""
    if candidate["kind"] == "upstream":
        scripted = torch.jit.load(candidate["path"], map_location="cpu").eval()
        data = optimize_for_mobile(scripted)._save_to_buffer_for_lite_interpreter()
        if candidate.get("save_to"):
            with open(candidate["save_to"], "wb") as f:
                f.write(data)
        return torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(data))
    return torch.jit.mobile._load_for_lite_interpreter(candidate["path"])


def percentile(values: list[float], q: float) -> float:
    """The value at rank ``int(q * n)`` of the sorted ``values`` (no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def profile(module: Callable[..., Any], x: torch.Tensor, iterations: int) -> dict[str, list[float]]:
    """op name -> [calls per run, self CPU microseconds per run]."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(iterations):
            module(x)
    ops: dict[str, list[float]] = {}
    for event in prof.key_averages():
        ops[event.key] = [event.count / iterations, event.self_cpu_time_total / iterations]
    return ops


def main() -> None:
    """Serve one request from stdin: save every candidate's output, time the candidates
    interleaved (wall and this thread's CPU time, ms per call), profile each alone (ops'
    self CPU microseconds per run), and write the reply as JSON to stdout."""
    request = json.load(sys.stdin)
    torch.set_num_threads(request["threads"])
    x = torch.load(request["input"])
    names = [c["name"] for c in request["candidates"]]
    modules = {c["name"]: load(c) for c in request["candidates"]}
    with torch.no_grad():
        outputs = {name: modules[name](x) for name in names}
        torch.save(outputs, request["outputs"])
        for name in names:
            for _ in range(request["warmup"]):
                modules[name](x)
        times: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}
        rng = random.Random(0)
        for _ in range(request["rounds"]):
            order = list(names)
            rng.shuffle(order)
            for name in order:
                start, start_cpu = time.perf_counter(), time.thread_time()
                modules[name](x)
                cpu[name].append((time.thread_time() - start_cpu) * 1e3)
                times[name].append((time.perf_counter() - start) * 1e3)
        iterations = request["profile_iterations"]
        profiles = {name: profile(modules[name], x, iterations) for name in names}
    reply = {
        "torch": torch.__version__,
        "xnnpack": bool(torch.backends.xnnpack.enabled),  # type: ignore[attr-defined]  # stubs omit it
        "threads": torch.get_num_threads(),
        "latency": {
            name: {
                "median": statistics.median(t),
                "p10": percentile(t, 0.1),
                "p90": percentile(t, 0.9),
            }
            for name, t in times.items()
        },
        # this thread's CPU time per call: with 1 thread, all of the work, whatever the load
        "cpu": {
            name: {"median": statistics.median(t), "p10": percentile(t, 0.1)}
            for name, t in cpu.items()
        },
        "profiles": profiles,
    }
    json.dump(reply, sys.stdout)


if __name__ == "__main__":
    main()
