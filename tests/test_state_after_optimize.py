"""The module fxmobile hands back starts from the caller's state, on every route and in every
check mode (issue 24, cause 5).

fxmobile runs the model, or what it makes of it, on the example inputs before handing it back:
eager's reference, shape propagation, torch.jit.trace, probes of the frozen graph, the gate. A
model that counts its calls in a buffer (or in a plain int) came back with the counter at 4
(``check="off"``) or 6, not at the caller's 0, so its first call computed something else than
the caller's model's first call. Each model here reads its counter in its output.
"""

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import fxmobile

X = torch.randn(1, 3, 8, 8)
CHECKS = ["off", "warn", "raise"]


class Counter(nn.Module):
    """Counts its calls in a buffer and an int, and adds the count to its output."""

    calls: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.register_buffer("calls", torch.zeros(1))
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        self.seen += 1
        return self.conv(x) + self.calls


class BranchingCounter(Counter):
    """A counter whose forward branches on a value: torch.fx cannot trace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        self.seen += 1
        if bool(x.sum() > 0):
            return self.conv(x) + self.calls
        return self.conv(-x) + self.calls


class Top(nn.Module):
    """A counter called from a traced forward (a leaf: torch.fx keeps it as a call)."""

    def __init__(self, inner: nn.Module | None = None) -> None:
        super().__init__()
        self.leaf = inner if inner is not None else Counter()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.leaf(x).relu()


class ShapedTop(Top):
    """Asks a shape for a Python int: plain torch.fx fails, shape-aware tracing answers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.leaf(x)
        return y.reshape(int(y.shape[0]), -1)


# route -> (the model, how to optimize it, the state names to compare, what the report says)
ROUTES: dict[str, tuple[Callable[[], nn.Module], dict[str, Any], str]] = {
    "torch.fx": (Top, {"leaf_modules": [Counter]}, "torch.fx"),
    "shape-aware": (ShapedTop, {"leaf_modules": [Counter]}, "torch.fx (shape-aware)"),
    "auto leaves": (lambda: Top(BranchingCounter()), {}, "torch.fx"),
    "torch.jit.trace": (Counter, {}, "torch.jit.trace"),
    "torch.jit.script": (BranchingCounter, {}, "torch.jit.script"),
}
FX_ROUTES = ["torch.fx", "shape-aware", "auto leaves"]


def state_names(model: nn.Module) -> list[str]:
    prefix = "leaf." if hasattr(model, "leaf") else ""
    return [f"{prefix}calls", f"{prefix}seen"]


def read(module: Any, name: str) -> Any:
    for part in name.split("."):
        module = getattr(module, part)
    return module


def assert_starts_like_the_caller(
    model: nn.Module, result: Callable[..., Any], traced: bool = False
) -> None:
    """Every counter of the result is at the caller's 0 (a trace records tensor ops only, so a
    traced module has no int counter), and its calls count on from there as eager's do."""
    for name in state_names(model):
        assert float(read(model, name)) == 0, f"the caller's {name} changed"
        if traced and name.endswith("seen"):
            continue
        assert float(read(result, name)) == 0, f"{name} is {float(read(result, name))}, not 0"
    fresh = copy.deepcopy(model)
    with torch.no_grad():
        for call in range(3):  # the calls count on from the caller's state, as eager's do
            assert torch.allclose(result(X), fresh(X), atol=1e-5), f"call {call + 1} differs"


def optimized(entry: str, model: nn.Module, check: str, **options: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # check="warn" on a model that fails: not these
        if entry == "optimize_fx":
            result = fxmobile.optimize_fx(model, X, check=check, **options)
            return result.graph_module, result.report
        mobile = fxmobile.optimize(model, example_inputs=X, check=check, **options)
        return mobile.module, mobile.report


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("route", FX_ROUTES)
def test_fx_stage_result_starts_from_the_callers_state(route: str, check: str) -> None:
    make, options, reported = ROUTES[route]
    model = make().eval()
    gm, report = optimized("optimize_fx", model, check, **options)
    assert report.route.startswith(reported)
    assert_starts_like_the_caller(model, gm)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("route", list(ROUTES))
def test_mobile_result_starts_from_the_callers_state(route: str, check: str) -> None:
    make, options, reported = ROUTES[route]
    model = make().eval()
    module, report = optimized("optimize", model, check, **options)
    assert report.route.startswith(reported)
    if route == "auto leaves":
        assert any("kept as opaque leaves" in note for note in report.notes)
    assert_starts_like_the_caller(model, module, traced=route == "torch.jit.trace")


@pytest.mark.parametrize("check", CHECKS)
def test_scriptmodule_result_starts_from_the_callers_state(check: str) -> None:
    scripted = torch.jit.script(BranchingCounter().eval())
    module, report = optimized("optimize", scripted, check)
    assert report.route == "TorchScript input"
    assert_starts_like_the_caller(scripted, module)


def test_scriptmodule_without_example_inputs_keeps_the_callers_state() -> None:
    scripted = torch.jit.script(BranchingCounter().eval())
    module = fxmobile.optimize_for_mobile(scripted)
    assert_starts_like_the_caller(scripted, module)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("route", ["torch.fx", "torch.export"])
def test_executorch_program_starts_from_the_callers_buffers(route: str, check: str) -> None:
    pytest.importorskip("executorch")
    from fxmobile.executorch.runtime import ProgramRunner

    model = (Top() if route == "torch.fx" else Counter()).eval()
    leaves = [Counter] if route == "torch.fx" else []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fxmobile.optimize(
            model, example_inputs=X, check=check, target_runtime="executorch", leaf_modules=leaves
        )
    assert result.report.route == route
    fresh = copy.deepcopy(model)
    # the .pte's initial buffer values, in a runner of its own, and the runner handed back
    for runner in (ProgramRunner(result.buffer), result.run):
        eager = copy.deepcopy(fresh)
        with torch.no_grad():
            for call in range(2):
                got = runner(X)
                got = got[0] if isinstance(got, list | tuple) else got
                assert torch.allclose(got, eager(X), atol=1e-5), f"call {call + 1} differs"
    assert float(read(model, state_names(model)[0])) == 0
