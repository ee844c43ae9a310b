"""Benchmark: fxmobile's prepacked ``*_run`` ops against the eager ATen ops they replace.

Why: the prepacked ops exist to be faster than ``F.conv2d``/``F.linear`` followed by a separate
clamp, the graph they replace. This measures every convolution and linear shape of
torchvision's mobilenet_v2 and resnet18 (batch 1, 224x224, 2 threads), each with the clamp its
model applies after it (relu6 -> [0, 6], relu -> [0, inf), none), for two input layouts:
contiguous NCHW (what a model's first layer, or any eager op, hands over) and channels-last
(what a prepacked convolution itself produces). Eager and prepacked calls run interleaved in
one process on the same input tensors, every call once per round in a new random order, and
the table reports per-call medians, the prepacked/eager ratio (below 1 is faster), and, for
mobilenet_v2, the sum over all its 52 convolutions as the model runs them (shapes weighted by
how often they occur).

Run: ``python benchmarks/bench_prepacked_ops.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
import torchvision
from tabulate import tabulate
from torch import fx, nn

from fxmobile.backends.library import OpFamily, ensure_registered

Clamp = tuple[float | None, float | None]


@dataclass(frozen=True)
class ConvShape:
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
    input: tuple[int, ...]
    weight: tuple[int, ...]
    clamp: Clamp

    def label(self) -> str:
        return f"linear {self.weight[1]}->{self.weight[0]}"


Shape = ConvShape | LinearShape


@dataclass
class Case:
    model: str
    shape: Shape
    count: int
    # name -> (eager, prepacked) callables, one pair per input layout
    calls: dict[str, tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]] = field(
        default_factory=dict
    )
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


def build_case(model: str, shape: Shape, count: int, gen: torch.Generator) -> Case:
    """Scripted eager and prepacked modules for one shape, checked equal on each layout.

    Both sides run as TorchScript, as they do in an optimized model, so both pay the same
    interpreter overhead per call.
    """
    case = Case(model, shape, count)
    w = torch.randn(shape.weight, generator=gen) * 0.1
    b = torch.randn(shape.weight[0], generator=gen) * 0.1
    lo, hi = shape.clamp
    x = torch.randn(shape.input, generator=gen)
    eager: nn.Module
    run: nn.Module
    if isinstance(shape, ConvShape):
        s = shape
        ctx = torch.ops.prepacked.conv2d_clamp_prepack(
            w, b, list(s.stride), list(s.padding), list(s.dilation), s.groups, lo, hi
        )
        eager, run = _EagerConv(w, b, s), _PrepackedConv(ctx)
        layouts = {"nchw": x, "channels_last": x.contiguous(memory_format=torch.channels_last)}
    else:
        ctx = torch.ops.prepacked.linear_clamp_prepack(w, b, lo, hi)
        eager, run = _EagerLinear(w, b, shape), _PrepackedLinear(ctx)
        layouts = {"nchw": x}
    eager_s, run_s = torch.jit.script(eager), torch.jit.script(run)
    for layout, xin in layouts.items():
        case.calls[layout] = (_bind(eager_s, xin), _bind(run_s, xin))
        torch.testing.assert_close(
            run_s(xin), eager_s(xin), rtol=1e-4, atol=1e-4, msg=f"{shape} {layout}: differs"
        )
        case.times[(layout, "eager")] = []
        case.times[(layout, "run")] = []
    return case


def measure(cases: list[Case], rounds: int, warmup: int = 5, seed: int = 0) -> None:
    """Times every call of every case once per round, in a new random order each round.

    The shuffle keeps any one call from always following the same other call (a large eager
    convolution, say, whose freed buffers slow whatever runs next); seconds per call are
    recorded in ``case.times``.
    """
    calls = [
        (case, layout, kind, fn)
        for case in cases
        for layout, pair in case.calls.items()
        for kind, fn in zip(("eager", "run"), pair, strict=True)
    ]
    order = random.Random(seed)
    for r in range(warmup + rounds):
        order.shuffle(calls)
        for case, layout, kind, fn in calls:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if r >= warmup:
                case.times[(layout, kind)].append(dt)


def _median_us(case: Case, layout: str, kind: str) -> float | None:
    t = case.times.get((layout, kind))
    return statistics.median(t) * 1e6 if t else None


def report(cases: list[Case]) -> str:
    headers = [
        "model",
        "op",
        "x",
        "clamp",
        "NCHW eager us",
        "NCHW run us",
        "ratio",
        "CL eager us",
        "CL run us",
        "ratio",
    ]
    rows = []
    sums = {k: 0.0 for k in ("nchw_e", "nchw_r", "cl_e", "cl_r")}
    n_convs = 0
    for c in cases:
        ne, nr = _median_us(c, "nchw", "eager"), _median_us(c, "nchw", "run")
        ce, cr = _median_us(c, "channels_last", "eager"), _median_us(c, "channels_last", "run")
        lo, hi = c.shape.clamp
        clamp = "none" if lo is None and hi is None else f"[{lo}, {hi}]"
        rows.append(
            [
                c.model,
                c.shape.label(),
                c.count,
                clamp,
                ne,
                nr,
                None if ne is None or nr is None else nr / ne,
                ce,
                cr,
                None if ce is None or cr is None else cr / ce,
            ]
        )
        if c.model == "mobilenet_v2" and isinstance(c.shape, ConvShape):
            assert ne is not None and nr is not None and ce is not None and cr is not None
            sums["nchw_e"] += c.count * ne
            sums["nchw_r"] += c.count * nr
            sums["cl_e"] += c.count * ce
            sums["cl_r"] += c.count * cr
            n_convs += c.count
    if n_convs:
        rows.append(_sum_row(sums, n_convs))
    return tabulate(rows, headers=headers, floatfmt=".2f", missingval="-")


def _sum_row(sums: dict[str, float], n_convs: int) -> list[object]:
    return [
        "mobilenet_v2",
        "SUM of all convs (x count)",
        n_convs,
        "",
        sums["nchw_e"],
        sums["nchw_r"],
        sums["nchw_r"] / sums["nchw_e"],
        sums["cl_e"],
        sums["cl_r"],
        sums["cl_r"] / sums["cl_e"],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200, help="timed rounds (default 200)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--models", nargs="+", default=["mobilenet_v2", "resnet18"])
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    ensure_registered(OpFamily.XNNPACK)
    gen = torch.Generator().manual_seed(0)
    cases = [
        build_case(model, shape, count, gen)
        for model in args.models
        for shape, count in model_shapes(model)
    ]
    with torch.inference_mode():
        measure(cases, args.rounds)
    print(f"torch {torch.__version__}, {args.threads} threads, {args.rounds} rounds, medians")
    print(report(cases))


if __name__ == "__main__":
    main()
