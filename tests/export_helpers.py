"""What the tests of the export stage's passes share: a model of one function, its exported
graph as the passes see it, one pass run through the stage's manager, op counts, and the
program it lowers to (its facts, and its outputs on ExecuTorch's runtime)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from fxmobile.executorch.export import export_module, rewritable
from fxmobile.executorch.lower import lower
from fxmobile.executorch.passes.stage import ExportStage
from fxmobile.executorch.runtime import ProgramRunner
from fxmobile.infra import PassManager
from fxmobile.passes.stage import FxContext, FxPass
from fxmobile.report import PassRecord, ProgramFacts

aten = torch.ops.aten


class Apply(nn.Module):
    """A model whose forward is ``fn``: one idiom per test, written as a lambda."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def exported(model: nn.Module, *inputs: Any) -> fx.GraphModule:
    """``model``'s exported graph, functional and unlifted, as the export stage rewrites it."""
    return rewritable(export_module(model.eval(), inputs, type(model).__name__))


def run_pass(p: FxPass, gm: fx.GraphModule, *inputs: Any) -> tuple[fx.GraphModule, PassRecord]:
    """``p`` through the export stage's manager (shapes from ``inputs``); the unit, its record."""
    unit, records = PassManager([p], ExportStage(inputs), FxContext(inputs)).run(gm)
    return unit, records[0]


def count(gm: fx.GraphModule, target: Any) -> int:
    """``call_function`` nodes of ``target``."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def program_of(gm: fx.GraphModule, *inputs: Any) -> ProgramFacts:
    """What ExecuTorch's XNNPACK lowering makes of ``gm``: delegates and portable ops."""
    return lower(export_module(gm, inputs, "rewritten"), "rewritten").facts


def program_outputs(gm: fx.GraphModule, *inputs: Any) -> Any:
    """``gm`` lowered for XNNPACK and run on ``inputs`` by ExecuTorch's runtime."""
    program = export_module(gm, inputs, "rewritten")
    runner = ProgramRunner(lower(program, "rewritten").buffer, program.call_spec.out_spec)
    return runner(*inputs)


def assert_same_nonfinite(
    expected: torch.Tensor,
    got: torch.Tensor,
    *,
    atol: float | None = None,
    rtol: float | None = None,
) -> None:
    """NaN where eager has NaN, and the same infinities: a rewrite must keep what eager does
    with a NaN or an infinity in its input. Given ``atol`` or ``rtol``, the finite values must
    be as close to eager's as ``torch.allclose`` says (its default for the other one); both 0:
    bit for bit."""
    assert torch.equal(expected.isnan(), got.isnan()), "NaN positions differ"
    assert torch.equal(expected.isposinf(), got.isposinf()), "+inf positions differ"
    assert torch.equal(expected.isneginf(), got.isneginf()), "-inf positions differ"
    if atol is None and rtol is None:
        return
    finite = expected.isfinite()
    atol, rtol = 1e-8 if atol is None else atol, 1e-5 if rtol is None else rtol
    assert torch.allclose(got[finite], expected[finite], atol=atol, rtol=rtol)
