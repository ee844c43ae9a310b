"""Optimizing never touches the caller's model, and the result shares no memory with it.

After ``optimize_fx`` (and the TorchScript stage, once ``fxmobile.optimize`` exists) the original
model's tensors are the same objects with the same bits, dtypes, shapes, strides, storage and
``requires_grad``; its module tree (names, types, training flags) is unchanged; its eager output
is bit-identical to the one before; and no parameter or buffer of the optimized module lives in a
storage of the original (so running or further rewriting one can never change the other,
pytorch/pytorch#104593). ``ModelSnapshot`` and ``assert_shares_no_storage`` are also used by the
fuzz test, on every fuzzed model.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

import fxmobile
from tests.helpers import randomize_batchnorm


def named_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter, buffer and plain tensor attribute, under every name it has."""
    yield from module.named_parameters(remove_duplicate=False)
    yield from module.named_buffers(remove_duplicate=False)
    if isinstance(module, torch.jit.ScriptModule):
        return
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for name, value in vars(sub).items():
            if isinstance(value, torch.Tensor):
                yield (f"{prefix}.{name}" if prefix else name), value


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


@dataclass(frozen=True)
class TensorState:
    tensor: torch.Tensor  # the object itself: it must still be the one the model holds
    bits: torch.Tensor
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    data_ptr: int
    requires_grad: bool
    is_parameter: bool

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorState:
        return cls(
            t, _bits(t).clone(), t.dtype, tuple(t.shape), t.stride(), t.data_ptr(),
            t.requires_grad, isinstance(t, nn.Parameter),
        )  # fmt: skip

    def differences(self, t: torch.Tensor) -> list[str]:
        now = TensorState.of(t)
        found = []
        if t is not self.tensor:
            found.append("replaced by another tensor object")
        attrs = ("dtype", "shape", "stride", "data_ptr", "requires_grad", "is_parameter")
        found.extend(
            f"{attr} {getattr(self, attr)} -> {getattr(now, attr)}"
            for attr in attrs
            if getattr(now, attr) != getattr(self, attr)
        )
        if now.bits.shape == self.bits.shape and not torch.equal(now.bits, self.bits):
            found.append("values changed")
        return found


@dataclass(frozen=True)
class ModelSnapshot:
    """What must not change: every tensor (by name) and the module tree with training flags."""

    tensors: dict[str, TensorState]
    modules: tuple[tuple[str, type, bool], ...]

    @classmethod
    def take(cls, model: nn.Module) -> ModelSnapshot:
        tensors = {name: TensorState.of(t) for name, t in named_tensors(model)}
        modules = tuple(
            (name, type(m), m.training) for name, m in model.named_modules(remove_duplicate=False)
        )
        return cls(tensors, modules)

    def assert_unchanged(self, model: nn.Module) -> None:
        now = dict(named_tensors(model))
        assert now.keys() == self.tensors.keys(), (
            f"the caller's model gained {sorted(now.keys() - self.tensors.keys())} and lost "
            f"{sorted(self.tensors.keys() - now.keys())}"
        )
        changed = {
            name: diff
            for name, state in self.tensors.items()
            if (diff := state.differences(now[name]))
        }
        assert not changed, f"the caller's model was modified: {changed}"
        modules = tuple(
            (name, type(m), m.training) for name, m in model.named_modules(remove_duplicate=False)
        )
        assert modules == self.modules, "the caller's module tree or training flags changed"


def storages(module: nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for _, t in named_tensors(module) if t.numel()}


def assert_shares_no_storage(optimized: nn.Module, original: nn.Module) -> None:
    shared = storages(optimized) & storages(original)
    names = [n for n, t in named_tensors(original) if t.untyped_storage().data_ptr() in shared]
    assert not shared, f"the optimized module shares storage with the original's {names}"


def assert_outputs_identical(before: Any, after: Any) -> None:
    b, b_spec = pytree.tree_flatten(before)
    a, a_spec = pytree.tree_flatten(after)
    assert a_spec == b_spec
    for x, y in zip(b, a, strict=True):
        assert torch.equal(x, y), "eager output of the original model changed"


# ----------------------------------------------------------------------------- torchvision

ZOO = ("resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0")
HAS_SCRIPT_STAGE = hasattr(fxmobile, "optimize")
STAGES = [
    pytest.param("fx", id="fx"),
    pytest.param(
        "script-cpu",
        id="script-cpu",
        marks=pytest.mark.skipif(
            not HAS_SCRIPT_STAGE,
            reason="fxmobile.optimize (the TorchScript stage) is not exported yet",
        ),
    ),
]


def optimized_module(stage: str, model: nn.Module, x: torch.Tensor) -> nn.Module:
    if stage == "fx":
        return fxmobile.optimize_fx(model, x).graph_module
    return fxmobile.optimize(model, example_inputs=x, backend="CPU").module


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_is_not_mutated(name: str, stage: str) -> None:
    import torchvision  # here, not at the top: the fuzz test imports this module's helpers

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    randomize_batchnorm(model).eval()
    x = torch.randn(1, 3, 64, 64)
    snapshot = ModelSnapshot.take(model)
    with torch.no_grad():
        before = model(x)
    optimized = optimized_module(stage, model, x)
    with torch.no_grad():
        optimized(x)  # running the result must not touch the original either
        after = model(x)
    snapshot.assert_unchanged(model)
    assert_outputs_identical(before, after)
    assert_shares_no_storage(optimized, model)


def test_snapshot_sees_a_mutation() -> None:
    """The checks above can fail: an in-place fold, a swapped parameter, a training flag."""
    conv = nn.Conv2d(3, 4, 3)
    model = nn.Sequential(conv, nn.BatchNorm2d(4)).eval()
    snapshot = ModelSnapshot.take(model)
    with torch.no_grad():
        conv.weight.mul_(2)
    with pytest.raises(AssertionError, match="values changed"):
        snapshot.assert_unchanged(model)

    snapshot = ModelSnapshot.take(model)
    conv.weight = nn.Parameter(conv.weight.detach().clone())
    with pytest.raises(AssertionError, match="replaced by another tensor object"):
        snapshot.assert_unchanged(model)

    snapshot = ModelSnapshot.take(model)
    model[0].train()
    with pytest.raises(AssertionError, match="training flags"):
        snapshot.assert_unchanged(model)

    with pytest.raises(AssertionError, match="shares storage"):
        assert_shares_no_storage(nn.Sequential(model[0]), model)
