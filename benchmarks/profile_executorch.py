"""Per-op profile of ExecuTorch 1.5.1's XNNPACK delegate, in the shape of ``profile_ops.py``.

Why: ``profile_ops.py`` says where fxmobile's files spend their time in the torch 2.12.1 lite
interpreter, per op; ``bench_peers.py`` says that ExecuTorch's program is faster or slower. This
script says where ExecuTorch spends its time, so the two per-op tables can be set side by side.

How, and where each figure comes from:

- The model and input are ``profile_ops.py``'s (torchvision, random weights, BatchNorm statistics
  randomized, eval, seed 0, 1x3x224x224), built here in fxmobile's torch. Their ``state_dict``
  and input go to a child process of the ExecuTorch venv (``.runtimes/executorch-1.5.1``, its
  own torch), which runs this same file with ``--child`` and imports nothing of fxmobile.
- The child lowers as ``executorch_peer.py`` does (``torch.export``,
  ``to_edge_transform_and_lower`` with ``XnnpackPartitioner``, ``to_executorch``), with
  ``generate_etrecord=True``; sizes the XNNPACK thread pool to ``--threads``; loads the ``.pte``
  twice, plain and with ETDump (``Runtime.load_program(..., enable_etdump=True)``); and runs the
  two interleaved (each round runs each once, in a fresh random order).
- Whole run: the plain method's wall time and the calling thread's CPU time per ``execute``
  (the Python call, with its input and output copies), the same wall time with ETDump on, and
  the runtime's own ``Method::execute`` and ``DELEGATE_CALL`` spans from the ETDump.
- Per op: the ETDump, read by ``executorch.devtools.Inspector``. The pip runtime is built with
  ``ET_EVENT_TRACER_ENABLED``, so the XNNPACK delegate logs one event per XNNPACK operator
  (``Convolution (NHWC, F32) DWConv #3``) from XNNPACK's own operator profiling. XNNPACK
  reports each operator in whole microseconds, truncated: a tiny operator reads 0, and the sum
  comes out a little under ``DELEGATE_CALL`` (the rest is the delegate's own work around
  them). Ops outside the delegate (``native_call_*`` events) are listed too.
- Per layer (``--layers``; always in the JSON): the delegate logs its events without a debug
  handle, so the Inspector cannot tie them to graph nodes. The convolutions and linears are
  paired with the convolution and fully connected operators by order instead (the order the
  delegate partitions define them in), and only when the counts match and every layer's kernel
  family does (depthwise as ``DWConv``, a linear or a plain 1x1 convolution as ``GEMM``, others
  as ``IGEMM``); otherwise the report says why it did not pair them.

Per op kind: calls per run and the median, over the profiled runs, of that kind's time in one
run. XNNPACK's kinds are not torch's (1x1 convolutions run as ``Fully Connected``): compare the
``convolution + fully connected`` line with ``prepacked::conv2d_clamp_run`` plus
``prepacked::linear_clamp_run`` in ``profile_ops.py``. With several delegate calls (shufflenet)
XNNPACK's operator numbers (``#n``) start again in each.

Run from the repository root with the peer installed (``make peers``):
``python benchmarks/profile_executorch.py [--models ...] [--threads 1] [--rounds N] [--json F]``.
The machine may be shared: compare within one run, and prefer the thread CPU time at 1 thread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# This file runs in two venvs: module-level imports are the standard library only; fxmobile's
# torch is imported in the parent's functions, ExecuTorch's torch in the child's.

MODELS = (
    "mobilenet_v3_small",
    "efficientnet_b0",
    "shufflenet_v2_x1_0",
    "resnet18",
    "resnet50",
)
INPUT_SHAPE = (1, 3, 224, 224)
PEER = "executorch-1.5.1"  # fxmobile.runtime.install.PEERS
# ETDump events that span others: the whole method, each delegate call
SPANS = ("Method::execute", "DELEGATE_CALL")
# XNNPACK operator kinds that run convolutions and linears (a 1x1 convolution becomes a fully
# connected operator): what prepacked::conv2d_clamp_run and linear_clamp_run do on 2.12.1
MATMUL_KINDS = ("Convolution", "Fully Connected")


def percentiles(values: list[float]) -> dict[str, float]:
    """Median, and the values at ranks ``int(0.1 n)`` and ``int(0.9 n)`` of the sorted values."""
    ordered = sorted(values)
    p10, p90 = (ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.1, 0.9))
    return {"median": statistics.median(ordered), "p10": p10, "p90": p90}


# ---- the child: ExecuTorch's venv ----------------------------------------------------------


def lower(request: dict[str, Any], workdir: Path) -> tuple[Path, Path, list[dict[str, Any]]]:
    """The model lowered to XNNPACK as ``executorch_peer.py`` does: its ``.pte``, its ETRecord
    and its convolutions and linears (``matmul_layers``)."""
    import torch
    import torchvision
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    model = torchvision.models.get_model(request["name"], weights=None)
    model.load_state_dict(torch.load(request["weights"], weights_only=True))
    model.eval()
    with torch.no_grad():
        exported = torch.export.export(model, (torch.randn(*INPUT_SHAPE),))
    edge = to_edge_transform_and_lower(
        exported, partitioner=[XnnpackPartitioner()], generate_etrecord=True
    )
    layers = matmul_layers(edge)
    program = edge.to_executorch()
    pte, etrecord = workdir / "model.pte", workdir / "model.etrecord"
    pte.write_bytes(program.buffer)
    program.get_etrecord().save(str(etrecord))
    return pte, etrecord, layers


def matmul_layers(lowered: Any) -> list[dict[str, Any]]:
    """The convolutions and linears inside the XNNPACK delegates, in the order they run: each
    delegate call's partition in its graph order, which the XNNPACK serializer follows (not the
    exported graph's order: shufflenet's two branches come out interleaved there). Per layer:
    module, weight and input shapes, and the XNNPACK kernel family it should run as (the last
    word of its operator's name): ``DWConv`` when depthwise, ``GEMM`` (fully connected) for a
    linear or a 1x1 convolution with stride 1, no padding, one group, ``IGEMM`` for any other."""
    from executorch.exir.delegate import executorch_call_delegate
    from executorch.exir.dialects._ops import ops as exir_ops

    edge = exir_ops.edge.aten
    program = lowered.exported_program()
    layers = []
    for call in program.graph.nodes:
        if call.target is not executorch_call_delegate:
            continue
        partition = getattr(program.graph_module, call.args[0].target).original_module
        for node in partition.graph.nodes:
            if node.target not in (edge.convolution.default, edge.linear.default):
                continue
            x, weight = (list(arg.meta["val"].shape) for arg in node.args[:2])
            if node.target is edge.linear.default:
                kernel = "GEMM"
            else:  # convolution(input, weight, bias, stride, padding, dilation, ..., groups)
                stride, padding, groups = node.args[3], node.args[4], node.args[8]
                pointwise = weight[2:] == [1, 1] and stride == [1, 1] and padding == [0, 0]
                if groups > 1 and groups == x[1]:
                    kernel = "DWConv"
                else:
                    kernel = "GEMM" if pointwise and groups == 1 else "IGEMM"
            module = list(node.meta["nn_module_stack"].values())[-1][0]
            layers.append({"module": module, "weight": weight, "input": x, "kernel": kernel})
    return layers


def per_layer(layers: list[dict[str, Any]], operators: list[list[Any]]) -> dict[str, Any]:
    """Each convolution and linear with its XNNPACK operator's median microseconds, paired in
    execution order; ``unmapped`` says why not when the counts or kernel families disagree
    (the events carry no link to graph nodes, so order is all that pairs them)."""
    matmuls = [op for op in operators if op[0].startswith(MATMUL_KINDS)]
    if len(matmuls) != len(layers):
        why = f"{len(layers)} convolutions and linears, {len(matmuls)} XNNPACK operators"
        return {"layers": [], "unmapped": why}
    paired = []
    for layer, (name, us) in zip(layers, matmuls, strict=True):
        if operator_kind(name).split()[-1] != layer["kernel"]:
            why = f"{layer['module']} should run as {layer['kernel']}, its operator is {name}"
            return {"layers": [], "unmapped": why}
        paired.append({**layer, "operator": name, "us": us})
    return {"layers": paired, "unmapped": None}


def operator_kind(event_name: str) -> str:
    """An event's op kind: XNNPACK's ``Convolution (NHWC, F32) DWConv #3`` loses its count, a
    kernel outside the delegate (``native_call_add.out``) its prefix."""
    return re.sub(r" #\d+$", "", event_name).removeprefix("native_call_")


def summarize(events: list[Any], warmup: int) -> dict[str, Any]:
    """Per op kind (calls per run, median microseconds per run), the spans' percentiles, and
    every operator in execution order with its median, from one ETDump block's events (each
    holds one time per run; the first ``warmup`` runs are dropped)."""
    per_run: dict[str, list[float]] = {}  # kind or span -> its time in each run

    def add(key: str, times: list[float]) -> None:
        before = per_run.get(key, [0.0] * len(times))
        per_run[key] = [a + b for a, b in zip(before, times, strict=True)]

    calls, where, operators = Counter[str](), {}, []
    for event in events:
        # OPERATOR_CALL wraps each native_call_* event: the kernel is counted, not twice
        if event.perf_data is None or event.name == "OPERATOR_CALL":
            continue
        times = list(event.perf_data.raw[warmup:])
        if event.name in SPANS:
            add(event.name, times)
            calls[event.name] += 1
            continue
        kind = operator_kind(event.name)
        add(kind, times)
        calls[kind] += 1
        where[kind] = event.delegate_backend_name or "outside the delegate"
        operators.append([event.name, statistics.median(times)])
        if event.is_delegated_op:
            add("XNNPACK operators", times)
    return {
        "spans_us": {s: percentiles(per_run[s]) for s in (*SPANS, "XNNPACK operators")},
        "delegate_calls": calls["DELEGATE_CALL"],
        "kinds": {
            k: {"where": where[k], "calls": calls[k], "us": statistics.median(per_run[k])}
            for k in where
        },
        "operators": operators,
    }


def timed(method: Any, x: torch.Tensor) -> tuple[float, float]:
    """One ``execute``: wall and calling-thread CPU milliseconds."""
    start, start_cpu = time.perf_counter(), time.thread_time()
    method.execute([x])
    return (time.perf_counter() - start) * 1e3, (time.thread_time() - start_cpu) * 1e3


def child() -> None:
    """Serve one request from stdin: lower, time plain and ETDump runs interleaved, read the
    ETDump with the Inspector, save the output for the parent's check, reply JSON on stdout."""
    import torch
    from executorch.devtools import Inspector
    from executorch.devtools.inspector import TimeScale
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime
    from executorch.version import __version__

    request = json.load(sys.stdin)
    workdir = Path(request["workdir"])
    threads, warmup, rounds = request["threads"], request["warmup"], request["rounds"]
    torch.set_num_threads(threads)
    portable_lib._unsafe_reset_threadpool(threads)
    pte, etrecord, layers = lower(request, workdir)
    x = torch.load(request["input"])
    runtime = Runtime.get()
    traced = runtime.load_program(pte, enable_etdump=True)
    methods = {
        "plain": runtime.load_program(pte).load_method("forward"),
        "etdump": traced.load_method("forward"),
    }
    torch.save(methods["plain"].execute([x])[0], request["output"])
    wall: dict[str, list[float]] = {name: [] for name in methods}
    cpu: list[float] = []
    for _ in range(warmup):
        for method in methods.values():
            method.execute([x])
    rng = random.Random(0)
    for _ in range(rounds):
        for name in rng.sample(list(methods), len(methods)):
            ms, cpu_ms = timed(methods[name], x)
            wall[name].append(ms)
            if name == "plain":
                cpu.append(cpu_ms)
    etdump = workdir / "model.etdp"
    traced.write_etdump_result_to_file(str(etdump), str(workdir / "debug.bin"))
    inspector = Inspector(
        etdump_path=str(etdump), etrecord=str(etrecord), target_time_scale=TimeScale.US
    )
    blocks = [b for b in inspector.event_blocks if b.name == "Execute"]
    if len(blocks) != 1:  # the Inspector groups runs by their events: all runs should match
        raise RuntimeError(f"{len(blocks)} groups of runs in the ETDump, expected 1")
    summary = summarize(blocks[0].events, warmup)
    reply = {
        "executorch": __version__.split("+")[0],
        "torch": torch.__version__.split("+")[0],
        "threads": portable_lib._threadpool_get_thread_count(),
        "wall_ms": percentiles(wall["plain"]),
        "cpu_ms": percentiles(cpu),
        "etdump_wall_ms": percentiles(wall["etdump"]),
        **summary,
        **per_layer(layers, summary["operators"]),
    }
    json.dump(reply, sys.stdout)


# ---- the parent: fxmobile's venv -----------------------------------------------------------


def build(name: str, workdir: Path) -> torch.Tensor:
    """``profile_ops.py``'s model and input: weights and input saved in ``workdir`` for the
    child; eager's output returned."""
    import torch
    from profile_ops import make_model  # next to this file; the parent's venv only

    model, x = make_model(name)
    torch.save(model.state_dict(), workdir / "weights.pt")
    torch.save(x, workdir / "input.pt")
    with torch.no_grad():
        output: torch.Tensor = model(x)
    return output


def run_child(python: Path, request: dict[str, Any], threads: int) -> dict[str, Any]:
    """This file with ``--child`` in the peer's ``python``, through ``profile_ops.run_child``;
    its JSON reply."""
    from profile_ops import run_child as run_isolated

    reply: dict[str, Any] = run_isolated(
        python, request, threads, (str(Path(__file__).resolve()), "--child")
    )
    return reply


def report(name: str, reply: dict[str, Any], top: int, layers: bool) -> None:
    """Print one model's whole-run table (ms), its per-op-kind table (us per run) and, with
    ``layers``, each convolution and linear with its XNNPACK operator (us per run)."""
    from tabulate import tabulate

    print(f"\n## {name} (ExecuTorch {reply['executorch']}, torch {reply['torch']}, XNNPACK "
          f"delegate, {reply['threads']} threads; {reply['delegate_calls']} delegate calls, "
          f"rel err {reply['relative_error']:.2g})")  # fmt: skip
    spans = {k: {q: us / 1e3 for q, us in v.items()} for k, v in reply["spans_us"].items()}
    rows = [
        ("execute, Python wall", reply["wall_ms"]),
        ("execute, thread CPU", reply["cpu_ms"]),
        ("execute with ETDump, Python wall", reply["etdump_wall_ms"]),
        ("Method::execute (ETDump)", spans["Method::execute"]),
        ("DELEGATE_CALL (ETDump)", spans["DELEGATE_CALL"]),
        ("XNNPACK operators, sum (ETDump)", spans["XNNPACK operators"]),
    ]
    table = [[label, s["median"], s["p10"], s["p90"]] for label, s in rows]
    print(tabulate(table, headers=["whole run", "median ms", "p10 ms", "p90 ms"], floatfmt=".3f"))
    execute_us = reply["spans_us"]["Method::execute"]["median"]
    kinds = sorted(reply["kinds"].items(), key=lambda item: -item[1]["us"])
    print(tabulate([[k, v["where"], v["calls"], v["us"], 100 * v["us"] / execute_us]
                    for k, v in kinds[:top]],
                   headers=["op", "runs in", "calls", "us", "% of execute"],
                   floatfmt=(".0f", ".0f", ".0f", ".0f", ".1f")))  # fmt: skip
    matmul = [v for k, v in reply["kinds"].items() if k.startswith(MATMUL_KINDS)]
    print(f"convolution + fully connected: {sum(v['calls'] for v in matmul)} calls, "
          f"{sum(v['us'] for v in matmul):.0f} us per run")  # fmt: skip
    if reply["unmapped"]:
        print(f"layers not paired with operators: {reply['unmapped']}")
    elif layers:
        table = [[x["module"], x["weight"], x["input"][2:], x["operator"], x["us"]]
                 for x in reply["layers"]]  # fmt: skip
        print(tabulate(table, headers=["layer", "weight", "input HxW", "XNNPACK operator", "us"]))


def main() -> None:
    """Build each model here, profile it in one ExecuTorch child per model, print the report
    (and the load average before and after); ``--json`` also writes the replies."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30, help="timed and profiled runs")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=15, help="op kinds shown per model")
    parser.add_argument("--layers", action="store_true", help="print each conv and linear")
    parser.add_argument("--json", type=Path, help="write the replies here")
    args = parser.parse_args()
    if args.child:
        child()
        return
    import torch

    from fxmobile.runtime.process import require_peer
    from fxmobile.verify import compare_outputs

    python = require_peer(PEER)
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"({os.cpu_count()} cores)")  # fmt: skip
    replies = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            workdir = Path(tmp) / name
            workdir.mkdir()
            expected = build(name, workdir)
            request = {
                "name": name,
                "workdir": str(workdir),
                "weights": str(workdir / "weights.pt"),
                "input": str(workdir / "input.pt"),
                "output": str(workdir / "output.pt"),
                "threads": args.threads,
                "rounds": args.rounds,
                "warmup": args.warmup,
            }
            reply = run_child(python, request, args.threads)
            actual = torch.load(workdir / "output.pt")
            reply["relative_error"] = compare_outputs(expected, actual, 1e-3)[0].relative_error
            report(name, reply, args.top, args.layers)
            replies[name] = reply
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "models": replies}, indent=1))


if __name__ == "__main__":
    main()
