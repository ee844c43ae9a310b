"""decompose_attention: scaled_dot_product_attention written out for a runtime without it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxmobile
from fxmobile.api import lite_file
from fxmobile.runtime.compat import backport_for, file_compatibility
from fxmobile.runtime.errors import IncompatibleRuntimeError
from fxmobile.script.decompose_attention import SDPA, DecomposeAttention
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent
from tests.script.common import frozen, kinds

OLD = ScriptContext(("forward",), (), None, frozenset({SDPA}))  # a runtime without the op


class Attention(nn.Module):
    """``F.scaled_dot_product_attention`` with the arguments under test."""

    def __init__(self, causal: bool = False, dropout: float = 0.0, scale: float | None = None):
        super().__init__()
        self.causal, self.dropout, self.scale = causal, dropout, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout, is_causal=self.causal, scale=self.scale
        )


class Masked(nn.Module):
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _qkv(seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 3, 7, 8, generator=gen) for _ in range(3))


@pytest.mark.parametrize("scale", [None, 0.3])
def test_plain_attention_is_written_out_for_a_runtime_without_it(scale: float | None) -> None:
    model = Attention(scale=scale).eval()
    result = DecomposeAttention().call(frozen(model), OLD)
    assert result.rewrites == 1
    found = kinds(result.unit)
    assert found[SDPA] == 0
    assert found["aten::matmul"] == 2 and found["aten::softmax"] == 1
    q, k, v = _qkv()
    assert_equivalent(model, result.unit, q, k, v)


def test_nothing_is_rewritten_for_a_runtime_that_has_it() -> None:
    result = DecomposeAttention().call(frozen(Attention().eval()), ScriptContext(("forward",), ()))
    assert result.rewrites == 0
    assert kinds(result.unit)[SDPA] == 1


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (Attention(causal=True), "causal attention"),
        (Attention(dropout=0.1), "attention with dropout"),
        (Masked(), "attention with a mask"),
    ],
)
def test_masked_causal_and_dropout_attention_are_left_with_the_reason(
    model: nn.Module, reason: str
) -> None:
    result = DecomposeAttention().call(frozen(model.eval()), OLD)
    assert result.rewrites == 0
    assert kinds(result.unit)[SDPA] == 1
    assert any(key.startswith(reason) for key in result.skips), result.skips


class Grouped(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


class ScaleFromInput(nn.Module):
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (Grouped(), "attention with grouped query heads"),
        (ScaleFromInput(), "attention whose scale is not a constant"),
    ],
)
def test_grouped_heads_and_a_scale_from_the_inputs_are_left(model: nn.Module, reason: str) -> None:
    result = DecomposeAttention().call(frozen(model.eval()), OLD)
    assert result.rewrites == 0 and kinds(result.unit)[SDPA] == 1
    assert list(result.skips) == [f"{reason} is left fused"]


class Several(nn.Module):
    """A masked call first (left), then two plain ones on 3-D (batch, tokens, features) inputs."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        plain = F.scaled_dot_product_attention(q, k, v)
        return masked + F.scaled_dot_product_attention(plain, k, v, scale=0.5)


def test_every_plain_call_after_a_left_one_is_written_out_on_3d_inputs() -> None:
    model = Several().eval()
    result = DecomposeAttention().call(frozen(model), OLD)
    assert result.rewrites == 2 and kinds(result.unit)[SDPA] == 1
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 5, 8, generator=gen) for _ in range(3))
    mask = torch.randn(5, 5, generator=gen)
    assert_equivalent(model, result.unit, q, k, v, mask)


class Encoder(nn.Module):
    """nn.MultiheadAttention, as torchvision's ViTs call it (need_weights=False)."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 4, batch_first=True)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.attention(x, x, x, need_weights=False)
        return self.norm(x + y)


def test_optimize_for_1_13_1_leaves_no_fused_attention_and_the_file_is_for_it() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    x = torch.randn(2, 5, 16)
    newest = fxmobile.optimize(model, example_inputs=x)
    newest_file = lite_file(newest.module, None)
    assert SDPA in file_compatibility(newest_file).operators
    verdict = file_compatibility(newest_file).verdicts["1.13.1"]
    assert not verdict.loads and "lacks aten::scaled_dot_product_attention" in verdict.reason
    with pytest.raises(IncompatibleRuntimeError, match="scaled_dot_product_attention"):
        backport_for("1.13.1", newest_file)

    old = fxmobile.optimize(model, example_inputs=x, target_runtime="1.13.1")
    assert kinds(old.module)[SDPA] == 0
    assert [p.rewrites for p in old.report.passes if p.name == "decompose_attention"] == [1]
    assert file_compatibility(lite_file(old.module, None)).verdicts["1.13.1"].loads
    assert_equivalent(model, old.module, x)
