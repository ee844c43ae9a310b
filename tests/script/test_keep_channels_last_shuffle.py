"""keep_channels_last_shuffle: ShuffleNet's channel shuffle keeps a channels-last network
channels-last; every other shape of the idiom is left alone, with the reason."""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.shufflenetv2 import InvertedResidual, channel_shuffle

import fxmobile
from fxmobile.report.records import PassRecord, Stage, Status
from fxmobile.script import keep_channels_last_shuffle as shuffle
from tests.helpers import assert_equivalent, randomize_batchnorm


class _Shuffles(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = InvertedResidual(8, 8, 1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(x)))


def _record(result: fxmobile.MobileResult) -> PassRecord:
    return next(
        p
        for p in result.report.passes
        if p.name == "keep_channels_last_shuffle" and p.stage is Stage.SCRIPT
    )


def _kinds(module: torch.jit.ScriptModule) -> list[str]:
    return [n.kind() for n in module.graph.nodes()]


def test_shuffle_stays_channels_last_on_both_routes() -> None:
    model = randomize_batchnorm(_Shuffles()).eval()
    x = torch.randn(2, 3, 10, 12)
    for source in (model, torch.jit.script(model)):
        result = fxmobile.optimize(source, example_inputs=x)
        assert _record(result).rewrites == 1
        kinds = _kinds(result.module)
        assert "aten::transpose" in kinds and "aten::copy_" in kinds
        assert kinds.count("aten::empty_like") == 1
        assert_equivalent(model, result.module, x)


def test_float64_shuffle_keeps_float64_numerics() -> None:
    model = randomize_batchnorm(_Shuffles()).eval().double()
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    assert _record(result).rewrites == 1
    assert_equivalent(model, result.module, x, rel=1e-12)


def test_nchw_network_keeps_its_shuffle() -> None:
    model = _Shuffles().eval()
    x = torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(model, example_inputs=x, channels_last=False)
    assert _record(result).status is Status.BLOCKLISTED  # channels_last=False switches it off
    assert "aten::empty_like" not in _kinds(result.module)
    assert_equivalent(model, result.module, x)


class _FlattensShuffle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.size()
        y = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return y.view(b, -1)


class _KeepsShuffled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        b, c, h, w = y.size()
        s = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return s.view(b, c, h, w), s


class _WritesShuffled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        out = channel_shuffle(y, 2)
        out.relu_()
        return self.conv(out[:, :3])


def test_cases_that_must_be_left_alone() -> None:
    x = torch.randn(1, 3, 6, 6)
    for model, reason in (
        (_FlattensShuffle(), shuffle.OTHER_SHAPE),
        (_KeepsShuffled(), shuffle.SHARED),
        # the write goes through views of the network's activations: the input conversion
        # already declines, so the shuffle never sees a channels-last input
        (_WritesShuffled(), shuffle.NOT_REACHED),
    ):
        model.eval()
        result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
        record = _record(result)
        assert record.rewrites == 0, type(model).__name__
        assert dict(record.skips) == {reason: 1}, (type(model).__name__, record.skips)
        assert_equivalent(model, result.module, x)
