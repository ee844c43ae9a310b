"""Randomness at capture time (issue 24, cause 4): a random call is a graph node that draws on
every call, or the model is refused, whatever ``check`` says, on every route
(``fxmobile.capture.random_calls``; what is random and what seeds: ``fxmobile.ops``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile import ops
from fxmobile.errors import CaptureError, RefusedError
from fxmobile.passes.constant_guard import RANDOM
from fxmobile.script.quiet_script import quietly_script
from tests.helpers import count_calls

X = torch.randn(1, 3, 8, 8)


class Noise(nn.Module):
    """``conv(x) + torch.randn(1, 8, 1, 1)``: a random factory with no tensor argument."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + torch.randn(1, 8, 1, 1)


class ShapedNoise(Noise):
    """A size read from the input (the shape-aware route answers it with a number, so the
    factory's arguments are all concrete there)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if int(y.shape[-1]) % 2:  # a branch on a shape: plain torch.fx cannot trace it
            y = y[..., :-1]
        return y + torch.randn(x.shape[0], 8, 1, 1)


class EveryFactory(Noise):
    """The random factories of torch, without a traced argument (``bernoulli`` of a constant)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)[:, torch.randperm(8)]
        y = y + torch.randint(0, 5, (1, 8, 1, 1)) + torch.normal(0.0, 1.0, (1, 8, 1, 1))
        return y * torch.bernoulli(torch.full((1, 8, 1, 1), 0.5)) + torch.rand(1, 8, 1, 1)


def _optimized(model: nn.Module, entry: str) -> Callable[..., Any]:
    if entry == "optimize_fx":
        return fxmobile.optimize_fx(model, X, check="off").graph_module
    return fxmobile.optimize(model, example_inputs=X, check="off").module


def _seeded(module: Callable[..., Any], x: torch.Tensor) -> torch.Tensor:
    with torch.random.fork_rng():
        torch.manual_seed(7)
        out: torch.Tensor = module(x)
    return out


@pytest.mark.parametrize("entry", ["optimize_fx", "optimize"])
@pytest.mark.parametrize("cls", [Noise, ShapedNoise, EveryFactory])
def test_a_random_factory_draws_on_every_call_of_the_optimized_module(
    cls: type[nn.Module], entry: str
) -> None:
    """torch.fx ran the factory once, at trace time, and baked its values in as a constant: the
    optimized module returned the same noise on every call. Now it is a graph node: two calls
    differ, and from one seed the module draws what eager draws."""
    model = cls().eval()
    optimized = _optimized(model, entry)
    with torch.no_grad():
        assert not torch.equal(optimized(X), optimized(X)), "the noise was baked in"
        torch.testing.assert_close(_seeded(optimized, X), _seeded(model, X))


def test_the_factory_is_a_node_and_fold_constants_leaves_it() -> None:
    result = fxmobile.optimize_fx(Noise().eval(), X, check="off")
    assert count_calls(result.graph_module, torch.randn) == 1
    assert result.report.record("fold_constants").skips == {RANDOM: 1}


class SeedsInForward(Noise):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(123)
        return self.conv(x) + torch.randn_like(x[:, :1])


class SeedsByOtherNames(Noise):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "random.manual_seed":
            torch.random.manual_seed(3)
        elif self.how == "seed":
            torch.seed()
        else:
            torch.set_rng_state(torch.get_rng_state())
        return self.conv(x)


class SeedsInASubmodule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = SeedsInForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 2


ENTRIES: dict[str, Callable[[nn.Module, str], object]] = {
    "optimize_fx": lambda m, check: fxmobile.optimize_fx(m, X, check=check),
    "optimize": lambda m, check: fxmobile.optimize(m, example_inputs=X, check=check),
    "executorch": lambda m, check: fxmobile.optimize(
        m, example_inputs=X, check=check, target_runtime="executorch"
    ),
}


@pytest.mark.parametrize("check", ["raise", "off"])
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_a_seed_call_in_forward_is_refused_naming_the_call_and_the_fix(
    entry: str, check: str
) -> None:
    """torch.manual_seed ran once, at trace time, and left nothing in the graph: with the check
    off the module came back, drawing other noise than eager's."""
    if entry == "executorch":
        pytest.importorskip("executorch")
    with pytest.raises(
        RefusedError,
        match=r"SeedsInForward\.forward calls torch\.manual_seed at .*test_random_at_capture\.py"
        r".*Fix: seed once before calling the model, outside forward",
    ):
        ENTRIES[entry](SeedsInForward().eval(), check)


@pytest.mark.parametrize("how", ["random.manual_seed", "seed", "set_rng_state"])
def test_every_seed_function_is_refused(how: str) -> None:
    call = "torch.manual_seed" if how == "random.manual_seed" else f"torch.{how}"
    with pytest.raises(RefusedError, match=rf"calls {call} at "):
        fxmobile.optimize(SeedsByOtherNames(how).eval(), example_inputs=X, check="off")


def test_a_seed_call_in_a_submodule_is_refused_too() -> None:
    """Refused, not kept as an automatic leaf: the ExecuTorch route exports through leaves."""
    with pytest.raises(RefusedError, match=r"SeedsInASubmodule\.forward calls torch\.manual_seed"):
        fxmobile.optimize(SeedsInASubmodule().eval(), example_inputs=X, check="off")


def test_a_seed_call_in_a_leaf_is_refused_when_the_graph_is_scripted() -> None:
    """torch.fx does not trace into a leaf; TorchScript compiles its call, which is refused as
    the traced one is."""
    with pytest.raises(RefusedError, match=r"SeedsInASubmodule\.forward calls torch\.manual_seed"):
        fxmobile.optimize(
            SeedsInASubmodule().eval(),
            example_inputs=X,
            leaf_modules=[SeedsInForward],
            check="off",
        )


class SeedsAfterABranch(Noise):
    """torch.fx stops at the branch, before the seed call: the fallback routes meet it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if bool(y.mean() > 0):
            y = y * 2
        torch.manual_seed(0)
        return y + torch.randn(1, 8, 1, 1)


class SeedsWithAState(Noise):
    """Unscriptable (an unannotated list written in forward): only torch.jit.trace takes it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(1)
        torch.manual_seed(0)
        return self.conv(x) + torch.randn(1, 8, 1, 1)


@pytest.mark.parametrize("cls", [SeedsAfterABranch, SeedsWithAState])
def test_a_seed_call_the_fallback_routes_meet_is_refused(cls: type[nn.Module]) -> None:
    """torch.jit.script keeps the call and torch.jit.trace drops it; both are refused, so the
    routes agree with torch.fx's."""
    with pytest.raises(RefusedError, match=rf"{cls.__name__}\.forward calls torch\.manual_seed"):
        fxmobile.optimize(cls().eval(), example_inputs=X, check="off")


class OwnGenerator(Noise):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator().manual_seed(3)
        return self.conv(x) + torch.randn(1, 8, 1, 1, generator=generator)


@pytest.mark.parametrize("entry", ["optimize_fx", "optimize"])
def test_a_generator_object_is_refused(entry: str) -> None:
    with pytest.raises(RefusedError, match=r"passes a torch\.Generator to torch\.randn at .*Fix"):
        ENTRIES[entry](OwnGenerator().eval(), "off")


class UnusedDraw(Noise):
    """A draw whose result nothing reads, before one that is used (fuzz finding F14)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.randn(4)  # advances the generator: the next draw depends on it
        return self.conv(x) + torch.randn(1, 8, 1, 1)


@pytest.mark.parametrize("check", ["raise", "off"])
def test_regression_an_unused_draw_is_refused_on_the_torchscript_route(check: str) -> None:
    """F14: TorchScript's dead-code elimination dropped the unused draw, so the used one took
    the numbers the unused one drew in eager; the gate refused it, and ``check="off"`` returned
    it. Now refused before scripting, whatever ``check`` says; the FX stage keeps the draw."""
    model = UnusedDraw().eval()
    with pytest.raises(RefusedError, match=r"draws random numbers it never uses \(torch\.randn\)"):
        fxmobile.optimize(model, example_inputs=X, check=check)
    module = _optimized(model, "optimize_fx")
    with torch.no_grad():
        torch.testing.assert_close(_seeded(module, X), _seeded(model, X))


class NoiseOnAConstant(Noise):
    """A random op on a tensor made at trace time: torch.fx would run it for real."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + torch.zeros(1, 8, 1, 1).normal_()


def test_a_random_op_on_a_tensor_made_at_trace_time_fails_torch_fx() -> None:
    with pytest.raises(CaptureError, match=r"aten::normal_ ran for real while torch\.fx traced"):
        fxmobile.optimize_fx(NoiseOnAConstant().eval(), X, check="off")


def test_a_random_op_on_a_tensor_made_at_trace_time_goes_to_torch_jit_trace() -> None:
    """torch.jit.trace records the op, so the module draws on every call."""
    model = NoiseOnAConstant().eval()
    result = fxmobile.optimize(model, example_inputs=X, check="off")
    assert result.report.route == "torch.jit.trace"
    assert "aten::normal_ ran for real" in result.report.declined[0]
    with torch.no_grad():
        assert not torch.equal(result.module(X), result.module(X))
        torch.testing.assert_close(_seeded(result.module, X), _seeded(model, X))


class NoiseWithACache(Noise):
    """A cache filled on the first call sends it to torch.jit.trace, which records the factory."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(1, 8, 1, 1))
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "b" not in self.cache:
            self.cache["b"] = self.scale * 2
        return self.conv(x) + self.cache["b"] + torch.randn(1, 8, 1, 1)


def test_the_traced_route_draws_on_every_call_too() -> None:
    result = fxmobile.optimize(NoiseWithACache().eval(), example_inputs=X, check="off")
    assert result.report.route == "torch.jit.trace"
    with torch.no_grad():
        assert not torch.equal(result.module(X), result.module(X))


def test_tracing_draws_nothing_from_the_users_generator() -> None:
    """The factory is recorded, not run: optimizing leaves torch's generator as it was."""
    model = Noise().eval()
    state = torch.get_rng_state()
    fxmobile.optimize_fx(model, check="off")
    assert torch.equal(torch.get_rng_state(), state)


# --- the facts, in fxmobile.ops --------------------------------------------------------------


def test_the_random_functions_are_read_from_torchs_tags() -> None:
    names = set(ops.random_functions())
    assert {"rand", "randn", "randint", "randperm", "normal", "bernoulli", "poisson"} <= names
    assert not {"empty", "zeros", "ones", "arange", "manual_seed"} & names


def test_the_seed_functions_are_read_from_torchs_schemas() -> None:
    assert ops.rng_state_functions() == ("manual_seed", "seed", "set_rng_state")
    assert ops.aten("manual_seed").seeds and ops.aten("seed").seeds
    assert not ops.aten("manual_seed").pure
    assert not ops.aten("randn").seeds and not ops.aten("initial_seed").seeds


def test_a_torchscript_seed_call_is_a_seeding_op() -> None:
    scripted = quietly_script(SeedsInForward().eval())
    found = [ops.script_op(n) for n in scripted.graph.nodes() if ops.script_op(n).seeds]
    assert [info.name for info in found] == ["aten::manual_seed"]
