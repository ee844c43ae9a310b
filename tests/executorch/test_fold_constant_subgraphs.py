"""``fold_constant_subgraphs``: what does not depend on the inputs, computed once into buffers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxmobile.executorch.passes.fold_constant_subgraphs import (
    WRITES,
    WRITTEN,
    FoldConstantSubgraphs,
)
from fxmobile.passes.constant_guard import RANDOM
from tests.export_helpers import Apply, aten, count, exported, program_of, run_pass
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


def shifted_window_mask(x: torch.Tensor, window: int, shift: int) -> torch.Tensor:
    """torchvision's Swin mask for the windows of ``x`` ([B, H, W, C]), rebuilt in forward."""
    height, width = x.shape[1], x.shape[2]
    mask = x.new_zeros((height, width))
    parts = ((0, -window), (-window, -shift), (-shift, None))
    region = 0
    for h in parts:
        for w in parts:
            mask[h[0] : h[1], w[0] : w[1]] = region
            region += 1
    mask = mask.view(height // window, window, width // window, window)
    mask = mask.permute(0, 2, 1, 3).reshape(-1, window * window)
    mask = mask.unsqueeze(1) - mask.unsqueeze(2)
    return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)


class ShiftedWindows(nn.Module):
    """Swin's window attention scores: the mask and the relative-position bias gathered from
    its table, both built on every call from constants."""

    index: torch.Tensor

    def __init__(self, window: int = 4) -> None:
        super().__init__()
        self.window = window
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2, 1))
        coords = torch.stack(
            torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
        )
        relative = (coords.flatten(1)[:, :, None] - coords.flatten(1)[:, None, :]).permute(1, 2, 0)
        relative = relative + (window - 1)
        self.register_buffer("index", relative[..., 0] * (2 * window - 1) + relative[..., 1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        n = self.window * self.window
        windows = x.view(b, h // self.window, self.window, w // self.window, self.window, c)
        windows = windows.permute(0, 1, 3, 2, 4, 5).reshape(-1, n, c)
        scores = torch.bmm(windows, windows.transpose(1, 2))
        bias = self.table[self.index.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous()
        return scores + bias + shifted_window_mask(x, self.window, self.window // 2)


def positional_encoding() -> nn.Module:
    timm_edgenext = pytest.importorskip("timm.models.edgenext")

    class Encoded(nn.Module):
        """EdgeNeXt's Fourier positional encoding (arange, cumsum, pow, sin, cos, a conv)."""

        def __init__(self) -> None:
            super().__init__()
            self.pos = timm_edgenext.PositionalEncodingFourier(dim=8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, _, h, w = x.shape
            return x + self.pos((b, h, w))

    return Encoded()


def test_swin_mask_and_bias_become_buffers_with_the_values_the_graph_computed() -> None:
    torch.manual_seed(0)
    model, x = ShiftedWindows().eval(), torch.randn(1, 8, 8, 4)
    gm = exported(model, x)
    with torch.no_grad():
        before = gm(x)
    built = [aten.new_zeros.default, aten.slice_scatter.default, aten.index.Tensor]
    assert all(count(gm, target) >= 1 for target in built)
    gm, record = run_pass(FoldConstantSubgraphs(), gm, x)
    assert record.rewrites == 2  # the mask and the bias, one buffer each
    assert all(count(gm, target) == 0 for target in built)
    assert count(gm, aten.masked_fill.Scalar) == 0
    with torch.no_grad():
        assert torch.equal(gm(x), before)  # the same ops ran, once
    assert_equivalent(model, gm, x)


def test_edgenext_positional_encoding_becomes_one_buffer_and_its_assertions_go() -> None:
    torch.manual_seed(0)
    model, x = positional_encoding().eval(), torch.randn(2, 8, 5, 6)
    gm = exported(model, x)
    assert count(gm, aten._assert_tensor_metadata.default) >= 1
    gm, record = run_pass(FoldConstantSubgraphs(), gm, x)
    assert record.rewrites == 1
    assert record.skips == {}
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert calls == [aten.add.Tensor]  # x + the encoding, nothing else left
    assert_equivalent(model, gm, x)


def test_the_folded_buffers_keep_the_dtype_the_graph_computed() -> None:
    model = Apply(lambda x: x.index_select(1, torch.arange(0, x.shape[1], 2)) * 2.0).eval()
    x = torch.randn(3, 6)
    gm, record = run_pass(FoldConstantSubgraphs(), exported(model, x), x)
    assert record.rewrites == 1
    assert [b.dtype for b in gm.buffers()] == [torch.int64]
    assert torch.equal(gm(x), model(x))


class Counter(nn.Module):
    """A buffer the model updates on every call, and a random draw."""

    calls: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x * (self.calls * 2.0) + torch.rand(3)


def test_random_ops_and_buffers_the_model_writes_are_left_with_the_reason() -> None:
    model, x = Counter().eval(), torch.randn(3)
    gm, record = run_pass(FoldConstantSubgraphs(), exported(model, x), x)
    assert record.rewrites == 0
    # calls + 1 and (calls + 1) * 2 read the buffer the copy_ writes back
    assert record.skips == {RANDOM: 1, WRITES: 1, WRITTEN: 2}
    assert count(gm, aten.rand.default) == 1
    torch.manual_seed(0)
    first = gm(x)
    torch.manual_seed(0)
    second = gm(x)  # the same draw, the count one more
    assert torch.allclose(second - first, 2.0 * x)


def test_a_result_much_larger_than_its_inputs_and_a_returned_constant_are_left() -> None:
    class Grows(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.row = nn.Parameter(torch.randn(1, 1024))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # 4 MiB from 4 KiB; and self.row * 2 returned as it is
            return x + (self.row + 1.0).expand(1024, 1024), self.row * 2.0

    model, x = Grows().eval(), torch.randn(1024, 1024)
    gm, record = run_pass(FoldConstantSubgraphs(), exported(model, x), x)
    assert record.skips == {
        "folded result would grow the model": 1,
        "constant returned as a model output": 1,
    }
    assert record.rewrites == 1  # self.row + 1.0, the expand's input: 4 KiB
    assert count(gm, aten.expand.default) == 1
    assert_equivalent(model, gm, x)


def test_swin_windows_lower_to_one_delegate_call_without_portable_ops() -> None:
    torch.manual_seed(0)
    model, x = ShiftedWindows().eval(), torch.randn(1, 8, 8, 4)
    before = program_of(exported(model, x), x)
    assert {"aten.index.Tensor", "aten.slice_scatter"} <= {p.op for p in before.portable_ops}
    gm, _ = run_pass(FoldConstantSubgraphs(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


class StdConv(nn.Module):
    """timm's ``StdConv2d`` (NF-Nets, ViT-hybrids): the conv's weight standardized per output
    channel on every call, by a batch norm in training mode without statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.conv.weight
        standardized = nn.functional.batch_norm(
            weight.reshape(1, 8, -1), None, None, training=True, momentum=0.0, eps=1e-6
        ).reshape_as(weight)
        return nn.functional.conv2d(x, standardized, self.conv.bias, padding=1)


def test_weight_standardization_becomes_a_constant_weight() -> None:
    """The batch norm exports as ``_native_batch_norm_legit.no_stats``, whose packet's default
    overload writes running statistics: judged by the packet it was never folded, and timm's
    nf_resnet26 kept 29 of them and their 29 convolutions on portable kernels."""
    torch.manual_seed(0)
    model, x = StdConv().eval(), torch.randn(1, 3, 8, 8)
    graph = exported(model, x)
    assert count(graph, aten._native_batch_norm_legit.no_stats) == 1
    gm, record = run_pass(FoldConstantSubgraphs(), graph, x)
    assert record.rewrites >= 1 and WRITES not in record.skips
    assert count(gm, aten._native_batch_norm_legit.no_stats) == 0
    assert_equivalent(model, gm, x)
    program = program_of(gm, x)
    assert (program.delegate_calls, program.portable_ops) == (1, ())
