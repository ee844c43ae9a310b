"""Measurement: which fallback route loses less optimization, torch.jit.script or torch.jit.trace.

Why: where torch.fx cannot capture a model, ``fxmobile.script.scripting.fallback_to_torchscript``
takes it whole, scripted or traced, and the order it tries them in decides the route of every
model both take. Each model below (torch.fx fails on each; both routes compile it) is scripted
and traced as the fallback does, and each result goes through the same TorchScript stage as
``fxmobile.optimize`` (CPU backend: freeze, fold, prepack, fuse). Printed per route: the
prepacked ops (convolutions and linears running XNNPACK-style kernels), the clamps left unfused
(a relu or hardtanh the prepacked op did not take), the ops a runtime still dispatches one by one
(``report.unfused_ops``), the rewrites of every pass, and the ops left in the graph, with the
``prim::If`` / ``prim::Loop`` nodes among them. Deterministic: no timing.

Run from the repository root: ``python benchmarks/measure_fallback_order.py``.
"""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch import nn

from fxmobile.api.script_flow import script_stage
from fxmobile.options import make_options
from fxmobile.report import Report
from fxmobile.script.control_flow import branches_on_inputs, frozen_forward
from fxmobile.script.jit_trace import trace
from fxmobile.script.quiet_script import quietly_script

INPUT = (1, 3, 16, 16)
CLAMPS = ("aten::relu", "aten::relu_", "aten::hardtanh", "aten::hardtanh_", "aten::clamp")


def block(c_in: int, c_out: int) -> nn.Sequential:
    """conv 3x3, BatchNorm, relu."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU())


class LayoutBranch(nn.Module):
    """``if y.is_contiguous()`` between conv blocks (issue 24, cause 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = block(3, 8), block(8, 8), block(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        if y.is_contiguous():
            return self.b(y)
        return self.c(y)


class DataDependent(nn.Module):
    """tests/test_capture_routes.py: a branch on the conv output's mean."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.mean() > 0:
            return y * 2
        return y - 1


class BranchInTheMiddle(nn.Module):
    """A stem, a branch on a value choosing one of two conv-bn-clamp blocks, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = block(3, 16)
        self.up = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU6())
        self.down = nn.Sequential(nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16), nn.Hardtanh(0.0, 6.0))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = self.up(y) if y.mean() > 0 else self.down(y)
        return F.relu(self.head(y.mean((2, 3))))


class WhileOnValue(nn.Module):
    """A loop whose trip count depends on the values."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.fc = block(3, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        while bool(y.abs().max() > 1.0):
            y = y / 2
        return torch.clamp(self.fc(y.mean((2, 3))), 0, 6)


class Counter(nn.Module):
    """tests/test_capture_routes.py: state written in forward, no control flow."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))
        self.stem = block(3, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        calls = self.calls
        assert isinstance(calls, torch.Tensor)
        calls.add_(1)
        return self.stem(x) * calls


class CacheFilledInForward(nn.Module):
    """tests/test_capture_routes.py: a cache filled on the first call (timm's LeViT)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bias = nn.Parameter(torch.randn(4, 1, 1))
        self.cache = {"none": torch.zeros(())}  # not empty: TorchScript types it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = str(x.device)
        if key not in self.cache:
            self.cache[key] = self.bias * 2
        return F.relu(self.conv(x) + self.cache[key])


MODELS: tuple[type[nn.Module], ...] = (
    LayoutBranch,
    DataDependent,
    BranchInTheMiddle,
    WhileOnValue,
    Counter,
    CacheFilledInForward,
)


def randomized(model: nn.Module) -> nn.Module:
    """``model`` in eval mode with random BatchNorm statistics (set, not run: running the
    model would fill its cache and count its calls)."""
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            assert module.running_mean is not None and module.running_var is not None
            module.running_mean.copy_(torch.randn(module.num_features, generator=generator))
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
    return model.eval()


def figures(scripted: torch.jit.ScriptModule, name: str, x: torch.Tensor) -> list[object]:
    """What the TorchScript stage made of ``scripted``: the columns of the table."""
    report = Report(model_name=name)
    script_stage(scripted, make_options(example_inputs=x, backend="CPU"), report)
    ops = report.ops_after or {}
    prepacked = sum(n for kind, n in ops.items() if kind.startswith("prepacked::"))
    clamps = sum(ops.get(kind, 0) for kind in CLAMPS)
    control = ops.get("prim::If", 0) + ops.get("prim::Loop", 0)
    unfused = sum((report.unfused_ops or {}).values())
    return [prepacked, clamps, unfused, report.rewrites, sum(ops.values()), control]


def measure(model: nn.Module, route: str, x: torch.Tensor) -> list[object]:
    """``figures`` of ``model`` scripted or traced (``route``) as the fallback does."""
    try:
        if route == "script":
            made = quietly_script(copy.deepcopy(model))
        else:
            made = trace(copy.deepcopy(model), (x,))[0]
        return figures(made, type(model).__name__, x)
    except Exception as exc:
        return [f"failed: {type(exc).__name__}", "", "", "", "", ""]


def main() -> None:
    """Print the table: each model traced, then scripted."""
    rows = []
    for cls in MODELS:
        torch.manual_seed(0)
        model = randomized(cls())
        x = torch.randn(INPUT)
        branches = len(branches_on_inputs(frozen_forward(quietly_script(copy.deepcopy(model)))))
        rows += [[cls.__name__, branches, r, *measure(model, r, x)] for r in ("trace", "script")]
    headers = [
        "model",
        "branches on inputs",
        "route",
        "prepacked ops",
        "clamps left",
        "unfused ops",
        "rewrites",
        "ops",
        "If/Loop",
    ]
    print(tabulate(rows, headers=headers))


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main()
