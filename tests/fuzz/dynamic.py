"""Blocks whose result depends on more than the values of the input (issue 24): branches on the
input's layout, dtype or shape; random draws and seed calls in forward; a call counter.

- **branch** (``Kind.BRANCH``): ``x * c if <condition> else x - c``, the condition
  ``x.is_contiguous()`` (layout), ``x.dtype == torch.float16`` (dtype) or ``x.shape[-1] > 4``
  (shape); written in a submodule (``Branch``, which torch.fx cannot trace: an automatic leaf),
  or in the model's own forward (no leaf can take it);
- **random** (``Kind.RANDOM``): ``x + torch.randn(1, C, 1, 1) * c``, a factory without tensor
  arguments (``randn``, ``rand``, ``normal``, ``randint``, or ``randn`` sized by
  ``x.shape[0]``), in the model's own forward; or the same draw after ``torch.manual_seed``, or
  from a ``torch.Generator`` of its own, both refused;
- **counter** (``Kind.COUNTER``): a submodule whose forward adds 1 to a buffer and returns
  ``x + calls * c``: the module handed back must start from the caller's count.

The oracle runs every module seeded (``tests.fuzz.oracle.run``), so eager and the optimized
module draw the same numbers, and from the caller's counts (``counters_kept``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from tests.fuzz.spec import Block, Kind, ModelSpec, Value

BRANCH_CONDITIONS = ("layout", "dtype", "shape")
RANDOM_CALLS = ("randn", "rand", "normal", "randint", "randn_batch", "seed", "generator")
REFUSED_RANDOM_CALLS = ("seed", "generator")
# torch's functions the drawn random blocks call: the optimized graph must still call them
RANDOM_FUNCTIONS = (torch.randn, torch.rand, torch.normal, torch.randint)
RANDOM_SCRIPT_OPS = frozenset({"aten::randn", "aten::rand", "aten::normal", "aten::randint"})


def condition(on: str, x: torch.Tensor) -> bool:
    if on == "layout":
        return x.is_contiguous()
    if on == "dtype":
        return x.dtype == torch.float16
    return x.shape[-1] > 4


def branch(on: str, x: torch.Tensor, value: float) -> torch.Tensor:
    if condition(on, x):
        return x * value
    return x - value


class Branch(nn.Module):
    """A layer whose forward branches on its input's layout, dtype or shape."""

    def __init__(self, on: str, value: float) -> None:
        super().__init__()
        self.on = on
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return branch(self.on, x, self.value)


class CallCounter(nn.Module):
    """Counts its calls in a buffer, and adds the count (times ``gain``) to its input."""

    calls: torch.Tensor

    def __init__(self, dtype: torch.dtype, gain: float) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(1, dtype=dtype))
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x + self.calls * self.gain


def draw_values(call: str, x: torch.Tensor, value: Value) -> torch.Tensor:
    """What a random block draws: one value per channel of ``x`` (of type ``value``), broadcast
    over the rest (float32 draws converted to ``x``'s dtype, so the float64 anchor draws the
    same numbers). The sizes are Python numbers: no traced argument."""
    shape = (1, value.channels, *(1,) * value.dims)
    if call == "randn":
        return torch.randn(shape).to(x.dtype)
    if call == "rand":
        return torch.rand(shape).to(x.dtype)
    if call == "normal":
        return torch.normal(0.0, 1.0, shape).to(x.dtype)
    if call == "randint":
        return torch.randint(0, 3, shape).to(x.dtype)
    if call == "randn_batch":
        return torch.randn(x.shape[0], *shape[1:]).to(x.dtype)
    if call == "seed":
        torch.manual_seed(7)
        return torch.randn(shape).to(x.dtype)
    generator = torch.Generator().manual_seed(3)
    return torch.randn(shape, generator=generator).to(x.dtype)


def run_random(x: torch.Tensor, block: Block) -> torch.Tensor:
    return x + draw_values(block.options["call"], x, block.out) * block.options["scale"]


def counter_paths(spec: ModelSpec) -> list[str]:
    """The paths of the call counters (``CallCounter``) of ``spec``'s model."""
    return [f"b{i}" for i, b in enumerate(spec.blocks) if b.kind is Kind.COUNTER]


def counters(module: Any, spec: ModelSpec) -> dict[str, torch.Tensor | None]:
    """Each counter's ``calls`` tensor in ``module`` (a FuzzModel, a GraphModule, a
    ScriptModule), None where it has none at that path."""
    found: dict[str, torch.Tensor | None] = {}
    for path in counter_paths(spec):
        owner = getattr(module, path, None)
        calls = getattr(owner, "calls", None) if owner is not None else None
        found[path] = calls if isinstance(calls, torch.Tensor) else None
    return found


@contextlib.contextmanager
def counters_kept(module: Any, spec: ModelSpec) -> Iterator[None]:
    """The counters of ``module`` set back after the block to what they held before: every run
    of the oracle starts from the same state."""
    before = {p: t.clone() for p, t in counters(module, spec).items() if t is not None}
    try:
        yield
    finally:
        now = counters(module, spec)
        with torch.no_grad():
            for path, value in before.items():
                tensor = now[path]
                if tensor is not None:
                    tensor.copy_(value)


def assert_counters_match(spec: ModelSpec, caller: Any, optimized: Any, when: str) -> None:
    """Every counter of the optimized module holds what the caller's model holds."""
    want, got = counters(caller, spec), counters(optimized, spec)
    for path, expected in want.items():
        assert expected is not None
        value = got[path]
        assert value is not None, f"the optimized module has no {path}.calls ({when})"
        assert torch.equal(value.to(expected.dtype), expected), (
            f"{path}.calls is {value.tolist()} in the optimized module, {expected.tolist()} in "
            f"the caller's model ({when}): the module handed back does not start from the "
            f"caller's state (fxmobile.capture.state)"
        )


def live_random_blocks(spec: ModelSpec, live: set[int]) -> int:
    """Random blocks (not refused) whose result the outputs are computed from."""
    return sum(
        b.kind is Kind.RANDOM and b.options["call"] not in REFUSED_RANDOM_CALLS and i + 1 in live
        for i, b in enumerate(spec.blocks)
    )


def random_calls_left(module: Any) -> int:
    """Random draws the optimized module still makes: calls of torch's random functions in a
    GraphModule (leaves included), random ops in a ScriptModule's graph."""
    if isinstance(module, torch.jit.ScriptModule):
        return sum(n.kind() in RANDOM_SCRIPT_OPS for n in module.inlined_graph.nodes())
    if isinstance(module, torch.fx.GraphModule):
        return sum(
            n.op == "call_function" and n.target in RANDOM_FUNCTIONS for n in module.graph.nodes
        )
    return 0


def refused_random(block: Block) -> bool:
    return block.kind is Kind.RANDOM and block.options["call"] in REFUSED_RANDOM_CALLS
