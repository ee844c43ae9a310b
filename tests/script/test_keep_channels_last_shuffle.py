"""keep_channels_last_shuffle: ShuffleNet's channel shuffle keeps a channels-last network
channels-last; every other shape of the idiom is left alone, with the reason."""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.shufflenetv2 import InvertedResidual, channel_shuffle

import fxmobile
from fxmobile.report.records import PassRecord, Stage, Status
from fxmobile.script import keep_channels_last_shuffle as shuffle
from fxmobile.script.stage import ScriptContext
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
        assert kinds.count("aten::channel_shuffle") == 1
        assert not {"aten::transpose", "aten::copy_", "aten::view"} & set(kinds)
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


def _shuffle_record(model: nn.Module, *inputs: torch.Tensor) -> PassRecord:
    result = fxmobile.optimize(torch.jit.script(model.eval()), example_inputs=inputs)
    assert_equivalent(model, result.module, *inputs)
    return _record(result)


class _ReadsSizeOne(nn.Module):
    """The channels as ``y.size(1)``, the other sizes one call each."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.head = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.size(0), y.size(1), y.size(2), y.size(3)
        s = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return self.head(s.view(b, c, h, w))


class _ReadsShape(nn.Module):
    """The channels as ``y.shape[1]``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.head = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, h, w = y.shape[0], y.shape[2], y.shape[3]
        s = y.view(b, 2, y.shape[1] // 2, h, w).transpose(1, 2).contiguous()
        return self.head(s.view(b, y.shape[1], h, w))


def test_every_way_of_reading_the_channels_is_recognised() -> None:
    x = torch.randn(2, 3, 6, 5)
    for model in (_ReadsSizeOne(), _ReadsShape()):
        record = _shuffle_record(model, x)
        assert record.rewrites == 1, (type(model).__name__, record.skips)
        assert dict(record.skips) == {}


def test_the_rewrite_is_one_channel_shuffle_of_the_channels_last_input() -> None:
    """``channel_shuffle(x, 2)`` replaces the idiom, and its NCHW ``contiguous`` goes (the only
    contiguous left are the input's and the output's conversions); its output is channels-last
    and equal to eager's shuffle."""
    model = randomize_batchnorm(_Shuffles()).eval()
    x = torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    (node,) = [n for n in result.module.graph.nodes() if n.kind() == "aten::channel_shuffle"]
    assert node.inputsAt(0).node().kind() == "aten::cat"  # the block's two branches
    assert node.inputsAt(1).toIValue() == 2
    contiguous = [n for n in result.module.graph.nodes() if n.kind() == "aten::contiguous"]
    assert [n.inputsAt(0).node().kind() for n in contiguous] == [
        "prim::Param",
        "prepacked::conv2d_clamp_run",
    ]
    y = torch.randn(2, 8, 5, 7).contiguous(memory_format=torch.channels_last)
    shuffled = torch.channel_shuffle(y, 2)
    assert shuffled.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(shuffled, channel_shuffle(y, 2))


class _Shuffle(nn.Module):
    """A shuffle of a converted activation; subclasses vary the idiom."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)
        self.head = nn.Conv2d(4, 4, 1)


class _ChannelsOfAnotherTensor(_Shuffle):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = x.size()  # x has y's channels, but it is not the shuffled tensor
        s = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return self.head(s.view(b, c, h, w))


class _ChannelsOfAnotherTensorsSize(_Shuffle):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, h, w = y.size(0), y.size(2), y.size(3)
        s = y.view(b, 2, 2, h, w).transpose(1, 2).contiguous()
        return self.head(s.view(b, x.size(1), h, w))


class _ChannelsOfAnotherTensorsShape(_Shuffle):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, h, w = y.shape[0], y.shape[2], y.shape[3]
        s = y.view(b, 2, 2, h, w).transpose(1, 2).contiguous()
        return self.head(s.view(b, x.shape[1], h, w))


class _LiteralChannels(_Shuffle):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.size()
        s = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return self.head(s.view(b, 4, h, w))


class _SwapsHeightAndWidth(_Shuffle):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.size()
        s = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return self.head(s.view(b, c, w, h))


class _ReadsTheShuffledTensor(_Shuffle):
    """The shuffled tensor's one user is not the view back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.size()
        s = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return self.head((s * 2).view(b, c, h, w))


def test_shuffles_that_are_not_the_exact_idiom_say_why() -> None:
    x = torch.randn(1, 4, 6, 5)
    for model, reason in (
        (_ChannelsOfAnotherTensor(), shuffle.OTHER_SHAPE),
        (_ChannelsOfAnotherTensorsSize(), shuffle.OTHER_SHAPE),
        (_ChannelsOfAnotherTensorsShape(), shuffle.OTHER_SHAPE),
        (_LiteralChannels(), shuffle.OTHER_SHAPE),
        (_SizesOfAnotherTensor(), shuffle.OTHER_SHAPE),
        (_SwapsHeightAndWidth(), shuffle.OTHER_SHAPE),
        (_ReadsTheShuffledTensor(), shuffle.SHARED),
    ):
        x_in = x if not isinstance(model, _SwapsHeightAndWidth) else torch.randn(1, 4, 5, 5)
        record = _shuffle_record(model, x_in)
        assert record.rewrites == 0, type(model).__name__
        assert dict(record.skips) == {reason: 1}, (type(model).__name__, record.skips)


class _ChannelsLastContiguous(_Shuffle):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.size()
        s = y.view(b, 2, c // 2, h, w).transpose(1, 2)
        return self.head(s.contiguous(memory_format=torch.channels_last_3d).reshape(b, c, h, w))


class _TransposesSpace(_Shuffle):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.size()
        s = y.view(b, 2, c // 2, h, w).transpose(3, 4).contiguous()
        return self.head(s.view(b, c, h, w))


class _FourDimensionalView(_Shuffle):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.size()
        s = y.view(b, c, h * w, 1).transpose(1, 2).contiguous()
        return self.head(s.view(b, c, h, w))


def test_near_idioms_are_not_taken_for_shuffles() -> None:
    """Not shuffles at all: no rewrite and no reason in the report."""
    x = torch.randn(1, 4, 6, 6)
    for model in (_ChannelsLastContiguous(), _TransposesSpace(), _FourDimensionalView()):
        record = _shuffle_record(model, x)
        assert record.rewrites == 0 and dict(record.skips) == {}, type(model).__name__


class _ConvertsItself(nn.Module):
    """Makes its own input channels-last and returns the shuffle as it is: the rewrite would
    hand back channels-last strides where eager returns NCHW."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x.contiguous(memory_format=torch.channels_last))
        return channel_shuffle(y, 2)


def test_a_rewrite_that_changes_output_strides_is_undone() -> None:
    model = _ConvertsItself().eval()
    x = torch.randn(2, 3, 6, 6)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=x)
    record = _record(result)
    assert record.rewrites == 0 and dict(record.skips) == {shuffle.CHANGED: 1}
    assert "aten::empty_like" not in _kinds(result.module)
    assert _kinds(result.module).count("aten::transpose") == 1
    result.module.graph.lint()
    assert result.module(x).stride() == model(x).stride()
    assert_equivalent(model, result.module, x)


def test_example_inputs_forward_cannot_run_leave_the_graph_alone() -> None:
    """Called directly: ``optimize`` runs the model on its example inputs before any pass, so
    inputs the graph cannot run (3 channels expected, 5 given) never reach the pass there."""
    model = _ConvertsItself().eval()
    x = torch.randn(2, 3, 6, 6)
    blocked = {fxmobile.MobileOptimizerType.CHANNELS_LAST}
    module = fxmobile.optimize(torch.jit.script(model), example_inputs=x, blocklist=blocked).module
    before = str(module.graph)
    ctx = ScriptContext(("forward",), (), (torch.randn(2, 5, 6, 6),))
    result = shuffle.KeepChannelsLastShuffle().call(module, ctx)
    assert result.unit is module and result.rewrites == 0
    assert dict(result.skips) == {shuffle.NOT_CHECKED: 1}
    assert str(module.graph) == before


def test_without_example_inputs_nothing_is_tried() -> None:
    """No example inputs, no conversion of the input: the shuffle is not even a candidate."""
    model = _Shuffles().eval()
    result = fxmobile.optimize(torch.jit.script(model))
    record = _record(result)
    assert record.rewrites == 0 and dict(record.skips) == {}
    assert "aten::empty_like" not in _kinds(result.module)


def test_a_network_without_shuffles_reports_nothing() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    record = _shuffle_record(model, torch.randn(1, 3, 8, 8))
    assert record.rewrites == 0 and dict(record.skips) == {}


class _ShufflesAnUnconvertedInput(nn.Module):
    """No convolution: the input stays NCHW (its ``contiguous()`` is NCHW too)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return channel_shuffle(x.contiguous(), 2) + 1


class _ReadsStridesAfterShuffle(nn.Module):
    """Converted by the model itself, but a stride read stops the walk from the input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = channel_shuffle(self.conv(x.contiguous(memory_format=torch.channels_last)), 2)
        return y.contiguous() + float(y.is_contiguous())


class _WritesItsShuffle(nn.Module):
    """Converted by the model itself; the shuffled tensor is written in place. The walk from
    the input stops at the first view of the written tensor, before the shuffle's own check
    (WRITTEN) is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = channel_shuffle(self.conv(x.contiguous(memory_format=torch.channels_last)), 2)
        out.relu_()
        return out.contiguous()


class _ShufflesTheOtherInput(nn.Module):
    """Shuffles an input that stays NCHW (it meets no convolution), beside a converted one."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = z.size()
        s = z.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return y + s.view(b, c, h, w)


class _SizesOfAnotherTensor(_Shuffle):
    """The batch and spatial sizes are read from another tensor of the same shape: the idiom
    asks for the shuffled tensor's own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        z = torch.relu(y)
        b, h, w = z.size(0), z.size(2), z.size(3)
        c = y.size(1)
        s = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return self.head(s.view(b, c, h, w) + z)


def test_shuffles_the_layout_change_does_not_reach_are_left() -> None:
    x = torch.randn(1, 4, 6, 6)
    for model, inputs in (
        (_ShufflesAnUnconvertedInput(), (x,)),
        (_ReadsStridesAfterShuffle(), (x,)),
        (_WritesItsShuffle(), (x,)),
        (_ShufflesTheOtherInput(), (x, torch.randn(1, 4, 6, 6))),
    ):
        record = _shuffle_record(model, *inputs)
        assert record.rewrites == 0, type(model).__name__
        assert dict(record.skips) == {shuffle.NOT_REACHED: 1}, (type(model).__name__, record.skips)


class _TwoShuffles(nn.Module):
    """The first shuffle is the idiom; the second one's shuffled tensor is also returned."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = channel_shuffle(self.conv(x), 2)
        b, c, h, w = y.size()
        s = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return s.view(b, c, h, w), s


def test_a_rewrite_and_a_refusal_in_one_forward_are_both_reported() -> None:
    record = _shuffle_record(_TwoShuffles(), torch.randn(1, 4, 6, 6))
    assert record.rewrites == 1 and dict(record.skips) == {shuffle.SHARED: 1}


class _ReshapeShuffle(_Shuffle):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.size()
        s = y.reshape(b, 2, c // 2, h, w).transpose(1, 2).contiguous()
        return self.head(s.view(b, c, h, w))


def test_a_shuffle_written_with_reshape_is_not_taken_for_the_view_idiom() -> None:
    """The rewrite knows ``view``, whose result shares the converted input's storage; a
    ``reshape`` is not looked into (nothing to report: it is no shuffle the pass knows)."""
    model = _ReshapeShuffle().eval()
    x = torch.randn(1, 4, 5, 6)
    record = _shuffle_record(model, x)
    assert (record.rewrites, dict(record.skips)) == (0, {})
