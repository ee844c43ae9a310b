"""Benchmark: fxmobile's prepacked ``*_run`` ops against the eager ATen ops they replace.

Why: the prepacked ops must never be slower than ``F.conv2d``/``F.linear`` followed by a
separate clamp, the graph they replace. This measures every convolution and linear shape of
the chosen torchvision models (batch 1, 224x224, 2 threads; by default mobilenet_v2, resnet18,
and resnext50_32x4d and resnext101_32x8d, whose 3x3 convolutions are grouped, 32 groups of 4 to
32 and of 8 to 64 channels), each with the clamp its
model applies after it (relu6 -> [0, 6], relu -> [0, inf), none), for two input layouts:
contiguous NCHW (what a model's first layer, or any eager op, hands over) and channels-last
(what a prepacked convolution itself produces). Eager and prepacked calls run interleaved in
one process on the same input tensors, every call once per round in a new random order, and
the table reports per-call medians, the prepacked/eager ratio (below 1 is faster), the path the
kernel took for that input (``fxmobile::kernel_path``: onednn, onednn_nchw, gemm, depthwise or
aten), and per model the sum over all its convolutions and linears as the model runs them
(shapes weighted by how often they occur).

``--paths`` also times every path each kernel can take (forced with
``fxmobile::force_kernel_path``), the figures behind the kernels' choice of path.

Run: ``python benchmarks/bench_prepacked_ops.py [--rounds N] [--models ...] [--paths]``;
``--write-docs`` also writes the per-model sums into the performance page
(``benchmarks/figures.py``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# OpenMP's spin-waiting makes 2-thread timings on a shared machine swing 2-10x (see the docs'
# performance page).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# run by path (python benchmarks/...), the repository root is not on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
import torchvision
from tabulate import tabulate
from torch import fx, nn

from benchmarks import figures
from fxmobile.backends.library import OpFamily, ensure_registered

Clamp = tuple[float | None, float | None]
LAYOUTS = ("nchw", "channels_last")
CONV_PATHS: tuple[str, ...] = ("aten", "onednn", "onednn_nchw", "gemm", "depthwise")
LINEAR_PATHS = ("aten", "gemm")
DEFAULT_MODELS = ["mobilenet_v2", "resnet18", "resnext50_32x4d", "resnext101_32x8d"]
# The block of docs/pages/performance.md that --write-docs fills.
FIGURES = "prepacked-ops"


@dataclass(frozen=True)
class ConvShape:
    """One convolution as a model calls it: input and weight shapes, its arguments, and the
    clamp (min, max; None for no bound) the model applies after it. Equal shapes are counted."""

    input: tuple[int, ...]
    weight: tuple[int, ...]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    clamp: Clamp

    def label(self) -> str:
        kh, kw = self.weight[2:]
        kind = "dw" if self.groups > 1 and self.groups == self.input[1] else f"g{self.groups}"
        return (
            f"conv {kh}x{kw} s{self.stride[0]} {kind} "
            f"{self.input[1]}->{self.weight[0]} @{self.input[2]}x{self.input[3]}"
        )


@dataclass(frozen=True)
class LinearShape:
    """One linear as a model calls it: input and weight shapes; the clamp is always (None,
    None), since ``model_shapes`` looks for activations after convolutions only."""

    input: tuple[int, ...]
    weight: tuple[int, ...]
    clamp: Clamp

    def label(self) -> str:
        return f"linear {self.weight[1]}->{self.weight[0]}"


Shape = ConvShape | LinearShape


@dataclass
class Case:
    """One shape of one model, ready to time: ``count`` is how often the model runs it, the
    calls are bound to their inputs per layout, and ``times`` collects seconds per call."""

    model: str
    shape: Shape
    count: int
    # (layout, candidate) -> callable; candidates: "eager", "run" and, with --paths, "path:NAME"
    calls: dict[tuple[str, str], Callable[[], torch.Tensor]] = field(default_factory=dict)
    # layout -> the path the unforced kernel takes
    path: dict[str, str] = field(default_factory=dict)
    times: dict[tuple[str, str], list[float]] = field(default_factory=dict)


def _activation_after(gm: fx.GraphModule, node: fx.Node) -> Clamp:
    """The clamp the model applies after ``node`` (through a BatchNorm), as (min, max)."""
    cur = node
    for _ in range(2):
        if len(cur.users) != 1:
            return (None, None)
        (user,) = cur.users
        if user.op == "call_module":
            mod = gm.get_submodule(str(user.target))
            if isinstance(mod, nn.BatchNorm2d):
                cur = user
                continue
            if isinstance(mod, nn.ReLU6):
                return (0.0, 6.0)
            if isinstance(mod, nn.ReLU):
                return (0.0, None)
            if isinstance(mod, nn.Hardtanh):
                return (mod.min_val, mod.max_val)
        if user.op == "call_function" and user.target in (F.relu, torch.relu):
            return (0.0, None)
        return (None, None)
    return (None, None)


def model_shapes(name: str) -> list[tuple[Shape, int]]:
    """Conv and linear shapes of a torchvision model at batch 1, 224x224, with counts."""
    model = getattr(torchvision.models, name)().eval()
    gm = fx.symbolic_trace(model)
    clamps = {
        str(n.target): _activation_after(gm, n)
        for n in gm.graph.nodes
        if n.op == "call_module" and isinstance(gm.get_submodule(str(n.target)), nn.Conv2d)
    }
    found: list[Shape] = []

    def hook(module: nn.Module, args: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        x = args[0]
        if isinstance(module, nn.Conv2d):
            found.append(
                ConvShape(
                    tuple(x.shape),
                    tuple(module.weight.shape),
                    (int(module.stride[0]), int(module.stride[1])),
                    (int(module.padding[0]), int(module.padding[1])),
                    (int(module.dilation[0]), int(module.dilation[1])),
                    module.groups,
                    clamps[names[module]],
                )
            )
        elif isinstance(module, nn.Linear):
            found.append(LinearShape(tuple(x.shape), tuple(module.weight.shape), (None, None)))

    names = {m: n for n, m in model.named_modules()}
    handles = [
        m.register_forward_hook(hook)
        for m in model.modules()
        if isinstance(m, nn.Conv2d | nn.Linear)
    ]
    with torch.no_grad():
        model(torch.randn(1, 3, 224, 224))
    for h in handles:
        h.remove()
    counts: dict[Shape, int] = {}
    for s in found:
        counts[s] = counts.get(s, 0) + 1
    return list(counts.items())


class _EagerConv(nn.Module):
    """The eager graph a prepacked convolution replaces: conv2d, then an in-place clamp."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor, s: ConvShape) -> None:
        super().__init__()
        self.w, self.b = w, b
        self.stride, self.padding, self.dilation = list(s.stride), list(s.padding), list(s.dilation)
        self.groups = s.groups
        self.lo, self.hi = s.clamp
        self.clamped = s.clamp != (None, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.conv2d(x, self.w, self.b, self.stride, self.padding, self.dilation, self.groups)
        if self.clamped:
            y = torch.clamp_(y, self.lo, self.hi)
        return y


class _EagerLinear(nn.Module):
    def __init__(self, w: torch.Tensor, b: torch.Tensor, s: LinearShape) -> None:
        super().__init__()
        self.w, self.b = w, b
        self.lo, self.hi = s.clamp
        self.clamped = s.clamp != (None, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, self.w, self.b)
        if self.clamped:
            y = torch.clamp_(y, self.lo, self.hi)
        return y


class _PrepackedConv(nn.Module):
    def __init__(self, ctx: torch.ScriptObject) -> None:
        super().__init__()
        self.ctx = ctx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.prepacked.conv2d_clamp_run(x, self.ctx)


class _PrepackedLinear(nn.Module):
    def __init__(self, ctx: torch.ScriptObject) -> None:
        super().__init__()
        self.ctx = ctx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.prepacked.linear_clamp_run(x, self.ctx)


def _bind(
    module: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> Callable[[], torch.Tensor]:
    return lambda: module(x)


def _prepack(shape: Shape, w: torch.Tensor, b: torch.Tensor) -> torch.ScriptObject:
    lo, hi = shape.clamp
    if isinstance(shape, ConvShape):
        s = shape
        return torch.ops.prepacked.conv2d_clamp_prepack(
            w, b, list(s.stride), list(s.padding), list(s.dilation), s.groups, lo, hi
        )
    return torch.ops.prepacked.linear_clamp_prepack(w, b, lo, hi)


def _run_module(shape: Shape, ctx: torch.ScriptObject) -> nn.Module:
    return _PrepackedConv(ctx) if isinstance(shape, ConvShape) else _PrepackedLinear(ctx)


def build_case(model: str, shape: Shape, count: int, gen: torch.Generator, all_paths: bool) -> Case:
    """Scripted eager and prepacked modules for one shape, checked equal on each layout.

    Both sides run as TorchScript, as they do in an optimized model, so both pay the same
    interpreter overhead per call.
    """
    case = Case(model, shape, count)
    w = torch.randn(shape.weight, generator=gen) * 0.1
    b = torch.randn(shape.weight[0], generator=gen) * 0.1
    x = torch.randn(shape.input, generator=gen)
    eager: nn.Module
    if isinstance(shape, ConvShape):
        eager = _EagerConv(w, b, shape)
        layouts = {"nchw": x, "channels_last": x.contiguous(memory_format=torch.channels_last)}
        paths = CONV_PATHS
    else:
        eager = _EagerLinear(w, b, shape)
        layouts = {"nchw": x}
        paths = LINEAR_PATHS
    ctx = _prepack(shape, w, b)
    candidates: dict[str, torch.jit.ScriptModule] = {
        "eager": torch.jit.script(eager),
        "run": torch.jit.script(_run_module(shape, ctx)),
    }
    if all_paths:
        for path in paths:
            forced_ctx = _prepack(shape, w, b)
            try:
                torch.ops.fxmobile.force_kernel_path(forced_ctx, path)
            except RuntimeError:
                continue  # a path this kernel cannot take
            candidates[f"path:{path}"] = torch.jit.script(_run_module(shape, forced_ctx))
    for layout, xin in layouts.items():
        case.path[layout] = torch.ops.fxmobile.kernel_path(ctx, xin)
        reference = candidates["eager"](xin)
        for name, module in candidates.items():
            torch.testing.assert_close(
                module(xin), reference, rtol=1e-4, atol=1e-4, msg=f"{shape} {layout} {name}"
            )
            case.calls[(layout, name)] = _bind(module, xin)
            case.times[(layout, name)] = []
    return case


def measure(cases: list[Case], rounds: int, warmup: int = 5, seed: int = 0) -> None:
    """Times every call of every case once per round, in a new random order each round.

    The shuffle keeps any one call from always following the same other call (a large eager
    convolution, say, whose freed buffers slow whatever runs next); seconds per call are
    recorded in ``case.times``.
    """
    calls = [(case, key, fn) for case in cases for key, fn in case.calls.items()]
    order = random.Random(seed)
    for r in range(warmup + rounds):
        order.shuffle(calls)
        for case, key, fn in calls:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if r >= warmup:
                case.times[key].append(dt)


def _median_us(case: Case, layout: str, name: str) -> float | None:
    t = case.times.get((layout, name))
    return statistics.median(t) * 1e6 if t else None


def _ratio(run: float | None, eager: float | None) -> float | None:
    return None if run is None or eager is None else run / eager


def model_sums(cases: list[Case], model: str) -> tuple[int, dict[tuple[str, str], float]]:
    """The convolutions and linears ``model`` runs, and the sum of their median microseconds
    per (layout, "eager" or "run"), each shape weighted by its count. A linear's input is the
    same in both layouts: its NCHW figures count in both sums."""
    sums = {(layout, name): 0.0 for layout in LAYOUTS for name in ("eager", "run")}
    n_ops = 0
    for c in (c for c in cases if c.model == model):
        for layout in LAYOUTS:
            source = layout if (layout, "eager") in c.times else "nchw"
            for name in ("eager", "run"):
                sums[(layout, name)] += c.count * (_median_us(c, source, name) or 0.0)
        n_ops += c.count
    return n_ops, sums


def sums_table(cases: list[Case]) -> str:
    """Per model, the sums of ``model_sums`` and their ratio (run / eager), as Markdown."""
    rows: list[list[object]] = []
    for model in dict.fromkeys(c.model for c in cases):
        n_ops, sums = model_sums(cases, model)
        row: list[object] = [model, n_ops]
        for layout in LAYOUTS:
            e, r = sums[(layout, "eager")], sums[(layout, "run")]
            row += [e, r, _ratio(r, e)]
        rows.append(row)
    headers = ["model", "convs and linears"]
    for tag in ("NCHW", "channels-last"):
        headers += [f"{tag}: eager us", f"{tag}: run us", f"{tag}: run / eager"]
    return figures.markdown_table(headers, rows, ".2f")


def report(cases: list[Case]) -> str:
    """The main table: per shape and layout (NCHW, channels-last) the median microseconds of the
    eager ATen op + clamp and of fxmobile's prepacked op, their ratio (below 1: prepacked is
    faster) and the kernel path taken; per model a sum row weighted by each shape's count.
    Linears have no channels-last row of their own: their NCHW figures count in both sums."""
    headers = ["model", "op", "x", "clamp"]
    for tag in ("NCHW", "CL"):
        headers += [f"{tag} eager us", f"{tag} run us", "ratio", f"{tag} path"]
    rows: list[list[object]] = []
    for model in dict.fromkeys(c.model for c in cases):
        for c in (c for c in cases if c.model == model):
            lo, hi = c.shape.clamp
            clamp = "none" if lo is None and hi is None else f"[{lo}, {hi}]"
            row: list[object] = [c.model, c.shape.label(), c.count, clamp]
            for layout in LAYOUTS:
                e, r = _median_us(c, layout, "eager"), _median_us(c, layout, "run")
                row += [e, r, _ratio(r, e), c.path.get(layout)]
            rows.append(row)
        n_ops, sums = model_sums(cases, model)
        sum_row: list[object] = [model, "SUM of all convs and linears (x count)", n_ops, ""]
        for layout in LAYOUTS:
            e, r = sums[(layout, "eager")], sums[(layout, "run")]
            sum_row += [e, r, _ratio(r, e), ""]
        rows.append(sum_row)
    return tabulate(rows, headers=headers, floatfmt=".2f", missingval="-")


def report_paths(cases: list[Case]) -> str:
    """Every path each kernel can take, per layout: median us and ratio to eager."""
    headers = ["model", "op", "layout", "eager us", "chosen"]
    headers += [f"{p} us" for p in CONV_PATHS]
    rows: list[list[object]] = []
    for c in cases:
        for layout in LAYOUTS:
            e = _median_us(c, layout, "eager")
            if e is None:
                continue
            row: list[object] = [c.model, c.shape.label(), layout, e, c.path.get(layout)]
            for p in CONV_PATHS:
                t = _median_us(c, layout, f"path:{p}")
                row.append(None if t is None else f"{t:.1f} ({t / e:.2f})")
            rows.append(row)
    return tabulate(rows, headers=headers, floatfmt=".1f", missingval="-")


def main() -> None:
    """Collect the shapes of ``--models``, build and check every case, time them all in one
    interleaved run under ``inference_mode`` with ``--threads`` torch threads, and print the
    tables. Both sides run in this process on torch 2.15: the ``prepacked::`` ops on
    fxmobile._C's kernels (upstream's XNNPACK op names, not XNNPACK), eager on ATen."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="timed rounds (default 100)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument(
        "--paths", action="store_true", help="also time every path each kernel can take"
    )
    figures.add_argument(parser)
    args = parser.parse_args()

    load_before, _ = figures.load()
    torch.set_num_threads(args.threads)
    ensure_registered(OpFamily.XNNPACK)
    gen = torch.Generator().manual_seed(0)
    cases = [
        build_case(model, shape, count, gen, args.paths)
        for model in args.models
        for shape, count in model_shapes(model)
    ]
    with torch.inference_mode():
        measure(cases, args.rounds)
    print(
        f"torch {torch.__version__}, {args.threads} threads, {args.rounds} rounds, medians, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; "
        "run = fxmobile's prepacked op (path: the kernel it took), eager = ATen op + clamp"
    )
    print(report(cases))
    if args.paths:
        print("\nevery path, forced: median us (ratio to eager)")
        print(report_paths(cases))
    if args.write_docs:
        run = figures.finish(
            runtime=f"torch {torch.__version__}",
            kernels="fxmobile._C's prepacked:: ops against ATen's op + clamp",
            threads=args.threads,
            load_before=load_before,
        )
        figures.write(FIGURES, sums_table(cases), run)


if __name__ == "__main__":
    main()
