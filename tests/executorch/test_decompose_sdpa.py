"""``decompose_sdpa``: attention as ``bmm`` and ``softmax``, constant masks added to the scores."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxmobile.executorch.passes.decompose_sdpa import DecomposeSdpa
from tests.export_helpers import aten, count, exported, program_of, run_pass
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


class Attention(nn.Module):
    def __init__(self, mask: torch.Tensor | None = None, **options: Any) -> None:
        super().__init__()
        self.options = options
        if mask is not None:
            self.register_buffer("mask", mask)
        else:
            self.mask = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, **self.options)


class MaskedAtRunTime(nn.Module):
    def forward(self, q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


class RandomMask(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = torch.randn(q.shape[-2], k.shape[-2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class BiasFromParameters(nn.Module):
    """CoAtNet's relative-position MLP: a bias over every pair of tokens, computed on each call
    from a small table of parameters (too large a result for the constant folding to store)."""

    index: torch.Tensor

    def __init__(self, tokens: int, heads: int, kind: str = "finite") -> None:
        super().__init__()
        torch.manual_seed(1)
        self.table = nn.Parameter(torch.randn(2 * tokens - 1, heads))
        offsets = torch.arange(tokens)[:, None] - torch.arange(tokens)[None, :] + tokens - 1
        self.register_buffer("index", offsets.flatten())
        self.tokens, self.heads, self.kind = tokens, heads, kind

    def bias(self) -> torch.Tensor:
        n, h = self.tokens, self.heads
        bias = torch.sigmoid(self.table)[self.index].reshape(n, n, h).permute(2, 0, 1)
        if self.kind == "infinite":
            bias = bias.masked_fill(bias > 0.5, float("-inf"))
        if self.kind == "boolean":
            return bias.unsqueeze(0) > 0.1
        return 16 * bias.unsqueeze(0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias())


def qkv(*shape: int, source: int | None = None) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    *batch, length, width = shape
    keys = (*batch, source or length, width)
    return torch.randn(shape), torch.randn(keys), torch.randn(keys)


def grouped(queries: tuple[int, ...], keys: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """q of shape ``queries``; k and v of shape ``keys`` (fewer heads, or heads of 1)."""
    torch.manual_seed(0)
    return torch.randn(queries), torch.randn(keys), torch.randn(keys)


def causal_bool(length: int, source: int) -> torch.Tensor:
    return torch.ones(length, source, dtype=torch.bool).tril()


@pytest.mark.parametrize(
    ("model", "inputs"),
    [
        (Attention(), qkv(2, 3, 5, 8)),
        (Attention(), qkv(4, 5, 8, source=7)),  # 3-D, more keys than queries
        (Attention(scale=0.3), qkv(1, 2, 6, 4)),
        (Attention(is_causal=True), qkv(1, 2, 6, 4)),
        (Attention(mask=causal_bool(6, 6)), qkv(1, 2, 6, 4)),
        (Attention(mask=torch.randn(2, 1, 6, 6)), qkv(2, 3, 6, 4)),  # float, broadcast heads
        (Attention(), grouped((2, 4, 5, 8), (2, 1, 7, 8))),  # multi-query: one key head
        (Attention(mask=torch.randn(2, 4, 5, 7)), grouped((2, 4, 5, 8), (2, 1, 7, 8))),
        (Attention(), grouped((2, 3, 5, 8), (1, 1, 7, 8))),  # keys shared by batch and heads
        (Attention(enable_gqa=True), grouped((1, 6, 5, 8), (1, 2, 5, 8))),
        (Attention(enable_gqa=True, is_causal=True), grouped((2, 4, 5, 8), (2, 2, 5, 8))),
    ],
    ids=[
        "plain",
        "three-d",
        "scale",
        "causal",
        "bool-mask",
        "float-mask",
        "multi-query",
        "multi-query-mask",
        "keys-for-all",
        "grouped-query",
        "grouped-query-causal",
    ],
)
def test_attention_becomes_two_bmms_and_a_softmax_and_matches_float64(
    model: nn.Module, inputs: tuple[torch.Tensor, ...]
) -> None:
    gm, record = run_pass(DecomposeSdpa(), exported(model, *inputs), *inputs)
    assert record.rewrites == 1
    assert count(gm, aten.scaled_dot_product_attention.default) == 0
    assert count(gm, aten.bmm.default) == 2
    assert count(gm, aten._softmax.default) == 1
    assert_equivalent(model, gm, *inputs)


def test_own_flow_leaves_six_kinds_of_op_outside_and_this_leaves_none() -> None:
    model, inputs = Attention(), qkv(1, 2, 6, 4)
    before = program_of(exported(model, *inputs), *inputs)
    assert {"aten.mul.Scalar", "aten.where.self", "aten.any.dim"} <= {
        p.op for p in before.portable_ops
    }
    gm, _ = run_pass(DecomposeSdpa(), exported(model, *inputs), *inputs)
    after = program_of(gm, *inputs)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_multi_query_attention_lowers_to_one_delegate_call() -> None:
    """MobileNetV4's hybrid blocks: 8 query heads, one key head. ExecuTorch's own flow leaves
    the attention's decomposition on portable kernels."""
    model, inputs = Attention(), grouped((1, 8, 16, 8), (1, 1, 4, 8))
    gm, _ = run_pass(DecomposeSdpa(), exported(model, *inputs), *inputs)
    after = program_of(gm, *inputs)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_a_mask_computed_from_parameters_is_added_as_the_model_computes_it() -> None:
    """Evaluated once to see it finite, then left to run: no constant of the mask's size."""
    model, inputs = BiasFromParameters(tokens=6, heads=2).eval(), qkv(1, 2, 6, 4)
    gm, record = run_pass(DecomposeSdpa(), exported(model, *inputs), *inputs)
    assert record.rewrites == 1
    assert count(gm, aten.scaled_dot_product_attention.default) == 0
    assert count(gm, aten.index.Tensor) == 1  # the bias is still gathered on every call
    assert not [n for n in gm.graph.nodes if n.op == "get_attr" and "mask" in str(n.target)]
    assert_equivalent(model, gm, *inputs)


@pytest.mark.parametrize(
    ("model", "inputs", "reason"),
    [
        (MaskedAtRunTime(), (qkv(1, 2, 4, 4)[0], torch.zeros(4, 4)), "computed from the inputs"),
        (
            Attention(mask=torch.ones(4, 4, dtype=torch.bool).triu(1)),  # row 3 sees no key
            qkv(1, 2, 4, 4),
            "a query attends to nothing under attn_mask",
        ),
        (
            BiasFromParameters(tokens=4, heads=2, kind="infinite"),
            qkv(1, 2, 4, 4),
            "attn_mask computed at run time holds an infinity or a NaN",
        ),
        (
            BiasFromParameters(tokens=4, heads=2, kind="boolean"),
            qkv(1, 2, 4, 4),
            "torch.bool attn_mask computed at run time",
        ),
        (RandomMask(), qkv(1, 2, 4, 4), "attn_mask drawn at random or not evaluable once"),
        (Attention(dropout_p=0.5), qkv(1, 2, 4, 4), "dropout_p is not 0"),
        (
            Attention(),
            grouped((1, 1, 3, 8), (1, 4, 3, 8)),  # the queries broadcast, not the keys
            "batch dims differ other than by k's heads of 1",
        ),
        (
            Attention(),
            grouped((2, 4, 3, 8), (1, 4, 3, 8)),  # a key dim of 1 before a shared one
            "batch dims differ other than by k's heads of 1",
        ),
    ],
    ids=[
        "run-time-mask",
        "fully-masked-row",
        "computed-infinite-mask",
        "computed-boolean-mask",
        "random-mask",
        "dropout",
        "queries-broadcast",
        "keys-1-then-4",
    ],
)
def test_what_it_cannot_prove_is_left_alone_with_the_reason(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], reason: str
) -> None:
    gm, record = run_pass(DecomposeSdpa(), exported(model, *inputs), *inputs)
    assert record.rewrites == 0
    assert any(reason in why for why in record.skips), record.skips
    assert count(gm, aten.scaled_dot_product_attention.default) == 1
