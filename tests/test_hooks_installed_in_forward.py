"""A forward that installs hooks as it runs (transformers' ``capture_outputs`` installs its
output recorders on the first call, then reads what they collect): torch.fx runs no hooks, so a
graph traced from it would read an empty collection. fxmobile takes the route that runs them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile.capture.hook_watch import HookRegistrationError, watch_hook_registration
from fxmobile.errors import CaptureError, FxMobileError
from tests.helpers import assert_equivalent


class RecordsOnFirstCall(nn.Module):
    """Adds the first layer's output, collected by a hook it installs on its first call."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4)
        self.collected: list[torch.Tensor] | None = None
        self.installed = False

    def _record(self, module: nn.Module, args: object, output: torch.Tensor) -> None:
        if self.collected is not None:
            self.collected.append(output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.installed:
            self.first.register_forward_hook(self._record)
            self.installed = True
        self.collected = []
        y = self.second(self.first(x))
        collected, self.collected = self.collected, None
        return y + collected[0]


def test_with_example_inputs_it_is_traced_by_torch_jit_trace_and_matches() -> None:
    model = RecordsOnFirstCall().eval()
    x = torch.randn(2, 4)
    result = fxmobile.optimize(model, example_inputs=x)
    assert result.report.route == "torch.jit.trace"
    assert any("installs forward hooks when it runs" in d for d in result.report.declined)
    assert not model.installed and not model.first._forward_hooks  # the user's model untouched
    assert_equivalent(copy.deepcopy(model), result.module, x)


def test_the_fx_stage_alone_refuses_it_naming_the_hook() -> None:
    with pytest.raises(CaptureError, match=r"register_forward_hook on Linear"):
        fxmobile.optimize_fx(RecordsOnFirstCall().eval(), torch.randn(2, 4))


def test_without_example_inputs_it_is_refused_cleanly() -> None:
    model = RecordsOnFirstCall().eval()
    with pytest.raises(FxMobileError):
        fxmobile.optimize(model)
    assert not model.installed and not model.first._forward_hooks


def test_the_watch_lists_or_refuses_registrations_and_restores_torch() -> None:
    original = nn.Module.register_forward_hook
    layer = nn.Linear(2, 2)
    with watch_hook_registration(refuse=False) as registered:
        layer.register_forward_hook(lambda m, i, o: None)
    assert registered == ["register_forward_hook on Linear"] and len(layer._forward_hooks) == 1
    with pytest.raises(HookRegistrationError), watch_hook_registration():
        layer.register_forward_pre_hook(lambda m, i: None)
    assert nn.Module.register_forward_hook is original and not layer._forward_pre_hooks


# The same pattern once the hooks are installed (SegFormer after its first call): the hooked
# module is kept as a call through __call__, its hook runs only when the graph runs, and the
# forward's read of the collection happened at trace time.
_SEEN: list[torch.Tensor] = []


def _collect(module: nn.Module, args: object, output: torch.Tensor) -> None:
    _SEEN.append(output)


class Head(nn.Module):
    def forward(self, y: torch.Tensor, features: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return y + features[-1]


class ReadsWhatAnInstalledHookCollects(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        self.second = nn.Linear(3, 3)
        self.head = Head()
        self.first.register_forward_hook(_collect)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _SEEN.clear()
        y = self.second(self.first(x))
        return self.head(y, tuple(_SEEN))


class Sink:
    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def __call__(self, module: nn.Module, args: object, output: torch.Tensor) -> None:
        self.seen.append(output)


class ReadsItsRecorderAttribute(nn.Module):
    """The recorder is an attribute: at trace time its list held the reference run's tensor,
    which torch.fx baked in as a constant, right on the example inputs only."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        self.second = nn.Linear(3, 3)
        self.sink = Sink()
        self.first.register_forward_hook(self.sink)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)) + self.sink.seen[-1]


@pytest.mark.parametrize(
    ("build", "refusal"),
    [
        (ReadsWhatAnInstalledHookCollects, r"keeps hooked modules \(first\).*graph fails"),
        (ReadsItsRecorderAttribute, r"attribute 'sink' \(changed in place\)"),
    ],
)
def test_a_forward_reading_what_its_installed_hooks_collect_goes_through_the_trace(
    build: type[nn.Module], refusal: str
) -> None:
    """Before: the first failed in shape propagation (a PassError), the second came back
    computing first(x) of the example input forever (off by 1.0 on any other input)."""
    torch.manual_seed(0)
    model = build().eval()
    x, other = torch.randn(2, 3), torch.randn(2, 3)
    with pytest.raises(CaptureError, match=refusal):
        fxmobile.optimize_fx(model, x)
    result = fxmobile.optimize(model, example_inputs=x)
    assert result.report.route == "torch.jit.trace"
    with torch.no_grad():
        torch.testing.assert_close(result.module(other), model(other))
