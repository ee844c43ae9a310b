"""static_shapes: every size and dtype it claims for a frozen mobile graph is the one a run gives,
and what does not follow from the inputs is left out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import fxmobile
from fxmobile.script import use_inplace_ops as inplace
from fxmobile.script.probe import probe
from fxmobile.script.static_shapes import Meta, scalar_type_number, static_shapes
from tests.helpers import randomize_batchnorm

Seen = tuple[dict[torch._C.Value, Meta], dict[torch._C.Value, list[Any]], list[torch._C.Value]]


def _seen(model: nn.Module, *inputs: torch.Tensor) -> Seen:
    """static_shapes' facts and one run's for ``forward``'s graph as use_inplace_ops gets it."""
    seen: list[Seen] = []
    real = inplace._facts

    def spy(module: torch.jit.ScriptModule, graph: torch._C.Graph, args: Any) -> Any:
        tensors = [
            v for n in graph.nodes() for v in n.outputs()
            if isinstance(v.type(), torch._C.TensorType)
        ]  # fmt: skip
        found = probe(module, graph, tensors, args, inplace._FACTS)
        assert found is not None
        seen.append((static_shapes(module, graph, args), found, tensors))
        return real(module, graph, args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inplace, "_facts", spy)
        fxmobile.optimize(model, example_inputs=inputs)
    (only,) = seen
    return only


def _assert_agrees(seen: Seen) -> None:
    static, found, _ = seen
    for value, meta in static.items():
        if value in found:
            size, dtype, _ = found[value]
            assert (list(meta.shape), scalar_type_number(meta.dtype)) == (list(size), dtype), (
                value.node()
            )


def _unknown(seen: Seen) -> list[str]:
    static, _, tensors = seen
    return [v.node().kind() for v in tensors if v not in static]


class Convolutions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
        self.up = nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.up2 = nn.ConvTranspose2d(4, 2, (2, 3), stride=(3, 1), dilation=(2, 1))
        self.fc = nn.Linear(16, 5)
        self.scale = nn.Parameter(torch.randn(1, 2, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.up2(self.up(self.conv(x))))
        return self.fc(torch.sigmoid(y * self.scale + 1))


class Pooling(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.head = nn.Conv2d(12, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        # ceil_mode: 7 -> 5 windows, 5 -> 4, but each last one would start in the padding
        a = F.max_pool2d(y, 2, 2, padding=1, ceil_mode=True)
        b = F.avg_pool2d(y, (2, 2), (2, 2), ceil_mode=True)
        c = F.adaptive_avg_pool2d(y, (4, 3))
        z = self.head(torch.cat([a, b, c], dim=-3))
        return F.hardswish(z).flatten(-2, -1).flatten(1)


@pytest.mark.parametrize(
    ("model", "shape"), [(Convolutions, (2, 4, 9, 7)), (Pooling, (1, 3, 7, 5))]
)  # fmt: skip
def test_every_tensor_follows_and_agrees_with_a_run(
    model: Callable[[], nn.Module], shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    seen = _seen(model().eval(), torch.randn(shape))
    _assert_agrees(seen)
    assert _unknown(seen) == []


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "squeezenet1_1", "googlenet"])
def test_torchvision_graphs_follow_without_a_run(name: str) -> None:
    """Residual adds, squeeze-excitation, ceil-mode pooling, concatenations."""
    model = getattr(torchvision.models, name)(weights=None).eval()
    randomize_batchnorm(model)
    seen = _seen(model, torch.randn(1, 3, 112, 112))
    _assert_agrees(seen)
    assert _unknown(seen) == []


class Undecided(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.low = nn.Parameter(torch.zeros(1, 3, 1, 1))

    def forward(
        self, x: torch.Tensor, n: torch.Tensor, scale: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        y = self.conv(x)
        return (
            torch.relu(n),  # an integer tensor: some ops promote it
            y * scale,  # a 0-dim float64 tensor does not promote a float32 one
            torch.clamp(y, self.low),  # a tensor bound broadcasts
            y.mean((2, 3)),  # no rule
        )


def test_what_does_not_follow_is_left_out() -> None:
    x, n, scale = torch.randn(1, 3, 4, 4), torch.arange(6).reshape(2, 3), torch.tensor(2.0).double()
    seen = _seen(Undecided().eval(), x, n, scale)
    _assert_agrees(seen)
    unknown = set(_unknown(seen))  # and the layout conversions of the outputs that read them
    assert unknown == {"aten::relu", "aten::mul", "aten::clamp", "aten::mean", "aten::contiguous"}
