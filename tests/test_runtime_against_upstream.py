"""against_upstream: an fxmobile file on the real runtime against eager and against upstream's
optimize_for_mobile made there from the same weights, checked and timed interleaved."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile.runtime.against_upstream import AgainstUpstream, _upstream_files, against_upstream
from fxmobile.script.serialization import lite_interpreter_bytes
from tests.helpers import randomize_batchnorm


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


class Unscriptable(nn.Module):
    def forward(self, *xs: torch.Tensor) -> torch.Tensor:  # TorchScript takes no *args
        return xs[0]


@pytest.mark.runtime("2.12.1")
def test_file_and_upstream_checked_and_timed_on_2_12_1() -> None:
    torch.manual_seed(0)
    model = randomize_batchnorm(Net()).eval()
    x = torch.randn(1, 3, 12, 12)
    data = lite_interpreter_bytes(fxmobile.optimize(model, example_inputs=x).module)
    found = against_upstream(model, data, [x], ["2.12.1"], latency=True, rounds=2, calls=1)
    assert found.passed
    assert [c.runtime for c in found.checks] == ["2.12.1"]
    assert all(c.passed for c in found.upstream_checks["2.12.1"])
    assert found.latency is not None
    assert list(found.latency) == ["eager", "fxmobile file on 2.12.1", "upstream file on 2.12.1"]
    assert all(t.timing.runs == 2 for t in found.latency.values())
    assert found.latency["upstream file on 2.12.1"].kernels == "XNNPACK"
    assert found.notes == []
    text = found.render()
    assert "upstream optimize_for_mobile on torch 2.12.1 against eager" in text
    assert "torch 2.12.1 (reference runtime)" in text


def test_a_model_that_does_not_script_gets_a_note_not_an_upstream_row() -> None:
    found = AgainstUpstream(checks=[])
    with contextlib.ExitStack() as stack:
        assert _upstream_files(Unscriptable(), {}, found, stack) == {}
    (note,) = found.notes
    assert note.startswith("no upstream candidate: the model does not script")
