"""A branch on the memory layout, baked by a trace (issue 24, cause 3): a trace is taken only when
it replays the model on the example inputs in other layouts too (``jit_trace.replays``), and
where forward branches on its inputs the scripted model comes first
(``fxmobile.script.control_flow``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile.capture.layouts import CHANNELS_LAST, NON_CONTIGUOUS, layout_dependence, other_layouts
from fxmobile.errors import ScriptingError
from fxmobile.script.control_flow import branches_on_inputs, frozen_forward
from fxmobile.script.jit_trace import replays, trace
from fxmobile.script.quiet_script import quietly_script
from fxmobile.script.scripting import fallback_to_torchscript, to_torchscript
from tests.helpers import assert_equivalent, captured

X = torch.randn(1, 3, 8, 8)
X3 = X[0]  # no channels-last copy: a stride branch shows only on a non-contiguous one
CL = X.contiguous(memory_format=torch.channels_last)
STRIDED = torch.zeros(1, 3, 8, 16)[..., ::2].copy_(X)


class LayoutBranch(nn.Module):
    """``if y.is_contiguous()``: torch.fx cannot trace it, the tracer does not warn."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.is_contiguous():
            return y * 2
        return y * 3


class StrideBranch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.stride(-1) == 1 else x * 3


class UnscriptableLayoutBranch(LayoutBranch):
    """The same branch, and ``**kwargs``, which TorchScript cannot compile."""

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return super().forward(x)


class UnscriptableStrideBranch(StrideBranch):
    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return super().forward(x)


@pytest.mark.parametrize("check", ["raise", "off"])
def test_a_branch_on_the_layout_is_kept_for_channels_last_inputs(check: str) -> None:
    """The trace fixed the contiguous branch: a channels-last input got ``* 2`` instead of
    ``* 3`` (off by a third). The model scripts, and TorchScript keeps the branch."""
    model = LayoutBranch().eval()
    result = fxmobile.optimize(model, example_inputs=X, check=check)
    assert result.report.route == "torch.jit.script"
    for x in (X, CL, STRIDED):
        assert_equivalent(model, result.module, x)


@pytest.mark.parametrize(
    ("cls", "x", "layout"),
    [(UnscriptableLayoutBranch, X, CHANNELS_LAST), (UnscriptableStrideBranch, X3, NON_CONTIGUOUS)],
)
def test_a_trace_that_differs_in_another_layout_is_refused(
    cls: type[nn.Module], x: torch.Tensor, layout: str
) -> None:
    """Nothing else takes the model: refused, whatever ``check`` says, naming the layout."""
    with pytest.raises(
        ScriptingError,
        match=rf"computes something else than forward on {layout} \(forward branches on its "
        r"inputs' memory layout.*Fix: make forward scriptable",
    ):
        fxmobile.optimize(cls().eval(), example_inputs=x, check="off")


def test_replays_names_the_layout_a_trace_differs_on() -> None:
    traced, _, before = trace(StrideBranch().eval(), (X3,))
    assert replays(traced, before, (X3,)) == NON_CONTIGUOUS
    traced, _, before = trace(LayoutBranch().eval(), (X,))
    assert replays(traced, before, (X,)) == CHANNELS_LAST
    traced, _, before = trace(nn.Conv2d(3, 4, 3).eval(), (X,))
    assert replays(traced, before, (X,)) is None


class NeedsContiguous(nn.Module):
    """Eager refuses channels-last inputs (``view``): that layout is not tried."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], -1) * 2


def test_a_layout_eager_refuses_is_not_tried() -> None:
    traced, _, before = trace(NeedsContiguous().eval(), (X,))
    assert replays(traced, before, (X,)) is None


class Counts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        calls = self.calls
        assert isinstance(calls, torch.Tensor)
        calls.add_(1)
        return x * calls


def test_replays_run_copies_and_leave_the_trace_as_traced() -> None:
    """Each replay runs copies of the trace and of the model: the module handed back keeps the
    state the trace left, however many layouts were tried."""
    traced, _, before = trace(Counts().eval(), (X,))
    assert float(traced.state_dict()["calls"]) == 1  # the trace's own call
    assert replays(traced, before, (X,)) is None
    assert float(traced.state_dict()["calls"]) == 1
    assert float(before.state_dict()["calls"]) == 0


class OpaqueLayoutBranch(nn.Module):
    """A leaf TorchScript cannot compile (a try block) that branches on its input's layout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return x * 2 if x.is_contiguous() else x * 3
        except ValueError:
            return x


class OuterLayoutBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = OpaqueLayoutBranch()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + 1


def test_the_whole_graph_trace_is_replayed_in_other_layouts_too() -> None:
    gm = captured(OuterLayoutBranch().eval(), leaf_modules=(OpaqueLayoutBranch,)).graph_module
    with pytest.raises(ScriptingError, match=rf"optimized graph on {CHANNELS_LAST}"):
        to_torchscript(gm, (X,))


# --- where forward branches on its inputs, the script comes first ----------------------------


class OffsetBranch(nn.Module):
    """A branch neither the tracer warns about nor another layout of the example takes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        if x.storage_offset() == 0:
            return y + 1
        return y - 1


def test_a_model_that_branches_on_its_inputs_is_scripted_before_it_is_traced() -> None:
    """The trace replayed on every input it was tried on, and was taken: a view with an offset
    got ``y + 1``."""
    model = OffsetBranch().eval()
    fallback = fallback_to_torchscript(model, (X,))
    assert (fallback.route, fallback.declined, fallback.notes) == ("torch.jit.script", [], [])
    shifted = torch.randn(2, 3, 8, 8)[1:]  # the float64 reference of assert_equivalent copies
    torch.testing.assert_close(fallback.module(shifted), model(shifted))


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.mean() > 0:
            return y * 2
        return y - 1


class WhileOnValue(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while bool(x.abs().max() > 1.0):
            x = x / 2
        return x


class Flag(nn.Module):
    def forward(self, x: torch.Tensor, double: bool) -> torch.Tensor:
        return x * 2 if double else x


class DeviceKeyedCache(nn.Module):
    """timm's LeViT: a cache keyed by the device, filled on the first call."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(3, 1, 1))
        # not empty, so that TorchScript can type it (a class annotation is a string here)
        self.cache = {"none": torch.zeros(())}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = str(x.device)
        if key not in self.cache:
            self.cache[key] = self.bias * 2
        return x + self.cache[key]


class ChecksItsInput(nn.Module):
    """A check that raises, and BatchNorm's checks of training mode, are no branches."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError("expected an image batch")
        return self.bn(x)


class ReadsTraining(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if self.training else x


@pytest.mark.parametrize(
    ("cls", "branches"),
    [
        (LayoutBranch, 1),
        (StrideBranch, 1),
        (OffsetBranch, 1),
        (DataDependent, 1),
        (WhileOnValue, 1),
        (Flag, 1),
        (DeviceKeyedCache, 0),
        (ChecksItsInput, 0),
        (ReadsTraining, 0),
        (Counts, 0),
    ],
)
def test_branches_on_inputs_finds_control_flow_on_forwards_arguments(
    cls: type[nn.Module], branches: int
) -> None:
    found = branches_on_inputs(frozen_forward(quietly_script(cls().eval())))
    assert len(found) == branches
    assert all("test_trace_layouts.py:" in where for where in found)


def test_without_control_flow_on_the_inputs_the_trace_comes_first() -> None:
    """A cache filled on the first call: the trace is as optimized and leaner."""
    model = DeviceKeyedCache().eval()
    fallback = fallback_to_torchscript(model, (X[0],))
    assert fallback.route == "torch.jit.trace"
    assert_equivalent(model, fallback.module, X[0])


# --- the layouts, and a model whose outputs depend on them ------------------------------------


def test_other_layouts_gives_the_same_values_in_other_strides() -> None:
    flat = torch.randn(5)
    variants = dict(other_layouts((X, flat, 3)))
    assert list(variants) == [CHANNELS_LAST, NON_CONTIGUOUS]
    moved, same, three = variants[CHANNELS_LAST]
    assert moved.is_contiguous(memory_format=torch.channels_last) and same is flat
    strided, strided_flat, _ = variants[NON_CONTIGUOUS]
    assert not strided.is_contiguous() and not strided_flat.is_contiguous()
    for got, want in ((moved, X), (strided, X), (strided_flat, flat)):
        assert torch.equal(got, want)
    assert three == 3
    assert other_layouts((torch.tensor(1.0),)) == []


def test_layout_dependence_finds_a_model_whose_outputs_follow_the_layout() -> None:
    """What an ExecuTorch program (its inputs made contiguous) cannot do."""
    assert layout_dependence(LayoutBranch().eval(), (X,), 1e-4) == CHANNELS_LAST
    assert layout_dependence(StrideBranch().eval(), (X3,), 1e-4) == NON_CONTIGUOUS
    assert layout_dependence(nn.Conv2d(3, 4, 3).eval(), (X,), 1e-4) is None
    assert layout_dependence(NeedsContiguous().eval(), (X,), 1e-4) is None


class RefusesChannelsLast(nn.Module):
    """Refuses a channels-last ``x``, and branches on the strides of ``z``."""

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
            raise RuntimeError("this model takes NCHW inputs only")
        return x.sum() * (2.0 if z.is_contiguous() else 3.0)


class SlightlyOffWhenStrided(nn.Module):
    """One percent off for a channels-last input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (1.0 if x.is_contiguous() else 1.01)


def test_a_layout_eager_refuses_does_not_stop_the_next_one_being_tried() -> None:
    """(A surviving mutant of layout_dependence: ``continue`` as ``break``.)"""
    inputs = (X, torch.randn(2, 6))
    assert layout_dependence(RefusesChannelsLast().eval(), inputs, 1e-4) == NON_CONTIGUOUS


def test_layout_dependence_compares_within_the_tolerance_it_is_given() -> None:
    """(A surviving mutant of layout_dependence: the tolerance dropped for the dtype's.)"""
    assert layout_dependence(SlightlyOffWhenStrided().eval(), (X,), 0.05) is None
    assert layout_dependence(SlightlyOffWhenStrided().eval(), (X,), None) == CHANNELS_LAST
