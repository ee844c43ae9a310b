"""Scripting the FX result: the return annotation FX copied is dropped, ``type_as`` keeps its
alias, and a module TorchScript cannot compile is traced with the example inputs, or refused
with what to do without them."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from fxmobile.errors import ScriptingError
from fxmobile.script.freeze import freeze
from fxmobile.script.scripting import to_torchscript
from tests.helpers import assert_equivalent, captured
from tests.script.common import kinds


class AnnotatedReturn(nn.Module):
    """Like googlenet: the forward's annotation names a type it does not return in eval."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x)


def test_scripting_drops_the_return_annotation_fx_copied() -> None:
    gm = captured(AnnotatedReturn().eval()).graph_module  # also resolves string annotations
    module, note = to_torchscript(gm, None)
    assert note is None
    x = torch.randn(2, 3)
    torch.testing.assert_close(module(x), gm(x))


class TypeAsWrite(nn.Module):
    def forward(self, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.type_as(like).add_(1)  # no conversion: writes y itself
        return y


def test_type_as_becomes_to_so_a_write_through_it_stays() -> None:
    model = TypeAsWrite().eval()
    gm = captured(model).graph_module
    module, _ = to_torchscript(gm, None)
    assert kinds(module)["aten::type_as"] == 0 and kinds(module)["aten::to"] == 1
    frozen = freeze(module, [])  # its dead-code elimination must keep the add_
    x, like = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(frozen(x, like), model(x, like))


def _unscriptable_gm() -> fx.GraphModule:
    class Opaque(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + sum(float(v) for v in x.flatten()[:2])  # a generator: not scriptable

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.opaque = Opaque()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.opaque(x) * 2

    class Tracer(fx.Tracer):
        def is_leaf_module(self, m: nn.Module, name: str) -> bool:
            return isinstance(m, Opaque) or super().is_leaf_module(m, name)

    root = Outer()
    return fx.GraphModule(root, Tracer().trace(root))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace_method` is deprecated")
def test_a_module_torchscript_cannot_compile_is_traced_with_the_example_inputs() -> None:
    gm = _unscriptable_gm()
    x = torch.randn(4)
    module, note = to_torchscript(gm, (x,))
    assert note is not None and note.startswith("scripting failed (")
    assert "traced with the example inputs instead" in note
    assert_equivalent(gm, module, x)


def test_without_example_inputs_it_is_refused_with_the_fix() -> None:
    with pytest.raises(ScriptingError, match="pass example_inputs so fxmobile can trace it"):
        to_torchscript(_unscriptable_gm(), None)
