"""``slice_selections``: select, unbind, split and chunk as slices (and reshapes)."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from fxmobile.executorch.passes.slice_selections import SliceSelections
from tests.export_helpers import Apply, aten, count, exported, program_of, run_pass
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


def unbind_qkv(x: torch.Tensor) -> torch.Tensor:
    q, k, v = x.unbind(0)
    return q * k + v


def chunks(x: torch.Tensor) -> torch.Tensor:
    a, b, c = x.chunk(3, dim=-1)  # 8 columns: parts of 3, 3 and 2
    return torch.cat([c, a * b, c], dim=-1)


def splits(x: torch.Tensor) -> torch.Tensor:
    a, b = x.split([5, 3], dim=-1)
    return a.sum(-1) + b.sum(-1)


CASES = {
    "select": (lambda x: x[:, 0] * 2, aten.select.int),
    "select-negative": (lambda x: x[:, -1] + 1, aten.select.int),
    "unbind": (unbind_qkv, aten.unbind.int),
    "chunk": (chunks, aten.split.Tensor),
    "split-sizes": (splits, aten.split_with_sizes.default),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_selection_becomes_slices_and_matches_float64(case: str) -> None:
    fn, target = CASES[case]
    torch.manual_seed(0)
    model, x = Apply(fn).eval(), torch.randn(3, 4, 8)
    gm = exported(model, x)
    assert count(gm, target) == 1
    gm, record = run_pass(SliceSelections(), gm, x)
    assert record.rewrites == 1
    assert count(gm, target) == 0
    assert count(gm, aten.slice.Tensor) >= 1
    assert_equivalent(model, gm, x)


def test_timm_style_unbind_lowers_to_one_delegate_call() -> None:
    torch.manual_seed(0)
    model, x = Apply(unbind_qkv).eval(), torch.randn(3, 2, 5, 8)
    before = program_of(exported(model, x), x)
    assert "aten.squeeze_copy.dims" in {p.op for p in before.portable_ops}
    gm, _ = run_pass(SliceSelections(), exported(model, x), x)
    assert (program_of(gm, x).delegate_calls, program_of(gm, x).portable_ops) == (1, ())


def test_parts_read_other_than_by_indexing_are_left_alone() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    parts = graph.call_function(aten.unbind.int, (x, 1))
    graph.output(graph.call_function(aten.stack.default, (parts, 0)))  # the list, read whole
    gm, t = fx.GraphModule(nn.Module(), graph), torch.randn(2, 3, 4)
    gm, record = run_pass(SliceSelections(), gm, t)
    assert record.rewrites == 0
    assert record.skips == {"its parts are used other than by indexing": 1}
    assert torch.equal(gm(t), torch.stack(t.unbind(1), 0))
