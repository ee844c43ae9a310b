"""freeze: submodules inlined, parameters turned into constants, preserved methods kept.

Counts of ``prim::GetAttr`` and ``prim::CallMethod`` (gone) and of the constants the weights
became, numerics against a float64 eager reference, and what freezing keeps: the preserved
methods and attributes, and, for a module with bundled inputs, upstream's list of bundled-input
methods. ``aten::linear`` stays ``aten::linear`` (``torch.jit.freeze``'s frozen optimizations
would have made it a matmul, hiding it from the backends).
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.bundled_inputs
from torch import nn

from fxmobile.script.freeze import Freeze, bundled_inputs_attributes
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.script.common import CTX, kinds, scripted

# torch.utils.bundled_inputs reads storages through the deprecated TypedStorage
pytestmark = pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")


class WithExport(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.block = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.lin(x))

    @torch.jit.export
    def twice(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def test_submodules_are_inlined_and_parameters_become_constants() -> None:
    model = WithExport().eval()
    given = scripted(model)
    before = sum(1 for _ in given.modules())
    result = Freeze().call(given, CTX)
    assert result.rewrites == before - 1 == 4  # lin, block, block.0, block.1 went
    assert not list(result.unit.children()) and not list(result.unit.parameters())
    graph_kinds = kinds(result.unit)
    assert graph_kinds["prim::GetAttr"] == 0 and graph_kinds["prim::CallMethod"] == 0
    assert graph_kinds["aten::linear"] == 2 and graph_kinds["aten::matmul"] == 0
    assert not result.unit._c._has_method("twice")  # not preserved: dropped
    assert_equivalent(model, result.unit, torch.randn(2, 3))
    assert list(given.children())  # the caller's module keeps its submodules


def test_preserved_methods_and_attributes_are_kept() -> None:
    model = WithExport().eval()
    ctx = ScriptContext(("forward", "twice"), ("twice", "scale"))
    result = Freeze().call(scripted(model), ctx)
    assert result.unit._c._has_method("twice") and result.unit.scale == 2.0
    assert kinds(result.unit, "twice")["prim::CallMethod"] == 0  # inlined there too
    x = torch.randn(2, 3)
    assert_equivalent(model.twice, result.unit.twice, x)
    assert_equivalent(model, result.unit, x)


def test_a_module_without_submodules_counts_nothing() -> None:
    class Plain(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sin() * 2

    result = Freeze().call(scripted(Plain()), CTX)
    assert result.rewrites == 0 and not result.modified and result.skips == {}
    assert_equivalent(Plain(), result.unit, torch.randn(4))


def fresh_type() -> torch.jit.ScriptModule:
    """A ``WithExport`` scripted as a type of its own: adding bundled inputs adds methods to the
    compiled type, which every scripted instance of one class shares."""

    class Fresh(WithExport):
        pass

    return scripted(Fresh())


def test_bundled_inputs_methods_are_kept_as_upstream_keeps_them() -> None:
    module = fresh_type()
    torch.utils.bundled_inputs.augment_many_model_functions_with_bundled_inputs(
        module, {module.forward: [(torch.randn(1, 3),)], module.twice: [(torch.randn(1, 3),)]}
    )
    attrs = bundled_inputs_attributes(module, ["twice"])
    assert attrs == [
        "get_all_bundled_inputs",
        "get_num_bundled_inputs",
        "get_bundled_inputs_functions_and_info",
        "forward",
        "get_all_bundled_inputs_for_forward",
        "_bundled_inputs_deflated_forward",
        "get_all_bundled_inputs_for_twice",
        "_bundled_inputs_deflated_twice",
    ]
    result = Freeze().call(module, ScriptContext(("forward", "twice"), ("twice", *attrs)))
    inputs = result.unit.get_all_bundled_inputs_for_twice()
    assert len(inputs) == 1 and result.unit.get_num_bundled_inputs() == 1
    torch.testing.assert_close(result.unit.twice(*inputs[0]), module.twice(*inputs[0]))


def test_a_module_without_bundled_inputs_keeps_nothing_extra() -> None:
    assert bundled_inputs_attributes(fresh_type(), []) == []


def test_forward_only_bundled_inputs_keep_the_forward_accessors() -> None:
    module = fresh_type()
    torch.utils.bundled_inputs.augment_model_with_bundled_inputs(module, [(torch.randn(1, 3),)])
    assert bundled_inputs_attributes(module, ["forward"]) == [
        "get_all_bundled_inputs",
        "get_num_bundled_inputs",
        "get_bundled_inputs_functions_and_info",
        "get_all_bundled_inputs_for_forward",
        "_bundled_inputs_deflated_forward",
    ]


@torch.jit.interface
class _Layer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[empty-body]
        pass


class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class _CallsThroughAnInterface(nn.Module):
    # a module interface (TorchScript calls it by its method, not its type); the annotation is
    # the class itself, which a string (this file's future annotations) would not resolve to
    __annotations__ = {"layer": _Layer}

    def __init__(self) -> None:
        super().__init__()
        self.layer = _Conv()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer.forward(x).relu()


def test_a_submodule_called_through_an_interface_is_inlined_too() -> None:
    """Freezing inlines interface calls as well (upstream freezes interfaces): the conv inside
    is then a graph node the later passes can rewrite."""
    model = _CallsThroughAnInterface().eval()
    result = Freeze().call(scripted(model), CTX)
    assert kinds(result.unit)["aten::conv2d"] == 1
    assert kinds(result.unit)["prim::CallMethod"] == 0
    assert_equivalent(model, result.unit, torch.randn(1, 3, 4, 4))
