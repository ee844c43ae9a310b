"""``reshape_views``: squeeze, unsqueeze, flatten, unflatten and no-op expands as reshapes."""

from __future__ import annotations

import pytest
import torch

from fxmobile.executorch.passes.reshape_views import ReshapeViews
from tests.export_helpers import Apply, aten, count, exported, program_of, run_pass
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


CASES = {
    "squeeze-dim": (lambda x: x[:, :1].squeeze(1) * x[:, 0], aten.squeeze.dim),
    "squeeze-dims": (lambda x: x[:1, :1].squeeze((0, 1)) * x[0, 0], aten.squeeze.dims),
    "squeeze-all": (lambda x: x[:1, :1].squeeze() * x[0, 0], aten.squeeze.default),
    "unsqueeze-inner": (lambda x: x.unsqueeze(1) * x.unsqueeze(1), aten.unsqueeze.default),
    "noop-expand": (lambda x: x.expand(3, -1, -1) * x, aten.expand.default),
    "repeat-by-ones": (lambda x: x.relu().repeat(1, 1, 1) * x, aten.repeat.default),
    "repeat-new-dims": (lambda x: x.relu().repeat(1, 1, 1, 1, 1) + 1, aten.repeat.default),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_shape_only_view_becomes_a_reshape(case: str) -> None:
    fn, target = CASES[case]
    torch.manual_seed(0)
    model, x = Apply(fn).eval(), torch.randn(3, 4, 8)
    gm = exported(model, x)
    assert count(gm, target) >= 1
    gm, record = run_pass(ReshapeViews(), gm, x)
    assert record.rewrites >= 1
    assert count(gm, target) == 0
    assert_equivalent(model, gm, x)


def test_a_trailing_unsqueeze_and_a_real_broadcast_stay() -> None:
    model = Apply(lambda x: x.unsqueeze(-1).expand(-1, -1, 3) * 2).eval()
    x = torch.randn(2, 5)
    gm, record = run_pass(ReshapeViews(), exported(model, x), x)
    assert record.rewrites == 0
    assert count(gm, aten.unsqueeze.default) == 1
    assert count(gm, aten.expand.default) == 1


def test_a_repeat_that_tiles_stays_with_the_reason() -> None:
    model, x = Apply(lambda x: x.repeat(2, 1, 1) * 2).eval(), torch.randn(3, 4, 8)
    gm, record = run_pass(ReshapeViews(), exported(model, x), x)
    assert record.rewrites == 0
    assert record.skips == {"a repeat that tiles (XNNPACK has no tiling op)": 1}
    assert count(gm, aten.repeat.default) == 1


def test_a_repeat_by_ones_no_longer_runs_outside_the_delegate() -> None:
    """XCiT repeats its positional encoding by the batch size: 1 here."""
    model, x = Apply(lambda x: torch.relu(x).repeat(1, 1, 1) * x).eval(), torch.randn(1, 4, 8)
    before = program_of(exported(model, x), x)
    assert {p.op for p in before.portable_ops} == {"aten.repeat"}
    gm, _ = run_pass(ReshapeViews(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_an_inner_unsqueeze_no_longer_cuts_the_delegate() -> None:
    model, x = (
        Apply(lambda x: torch.relu(x).unsqueeze(1) * x.unsqueeze(1)).eval(),
        torch.randn(2, 5),
    )
    before = program_of(exported(model, x), x)
    assert {p.op for p in before.portable_ops} == {"aten.unsqueeze_copy"}
    gm, _ = run_pass(ReshapeViews(), exported(model, x), x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_a_slice_over_whole_dims_no_longer_cuts_the_delegate() -> None:
    # timm's Swin crops its windows back with x[:, :H, :W, :] in every block; the export keeps
    # that as an alias, which the partitioner declined: Swin-T was 13 delegates and 12 copies
    model = Apply(lambda x: torch.relu(x)[:, :4, :8].contiguous() * x).eval()
    x = torch.randn(2, 4, 8)
    gm = exported(model, x)
    assert count(gm, aten.alias.default) == 1
    before = program_of(gm, x)
    assert {p.op for p in before.portable_ops} == {"aten.alias_copy"}
    gm, record = run_pass(ReshapeViews(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.alias.default) == count(gm, aten.reshape.default) == 0
    assert_equivalent(model, gm, x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_an_alias_that_is_an_output_becomes_a_reshape() -> None:
    model = Apply(lambda x: torch.relu(x)[:, :4]).eval()
    x = torch.randn(2, 4)
    gm = exported(model, x)
    assert count(gm, aten.alias.default) == 1
    gm, record = run_pass(ReshapeViews(), gm, x)
    assert record.rewrites == 1
    assert count(gm, aten.alias.default) == 0
    assert count(gm, aten.reshape.default) == 1
    assert_equivalent(model, gm, x)


def test_a_cat_of_one_tensor_no_longer_cuts_the_delegate() -> None:
    # torchvision's DenseNet starts each dense block with torch.cat([features], 1): the
    # partitioner takes a cat of two tensors or more, so DenseNet-121 was 5 delegate calls
    model = Apply(lambda x: torch.cat([torch.relu(x)], 1) * x).eval()
    x = torch.randn(2, 3, 4)
    before = program_of(exported(model, x), x)
    assert {p.op for p in before.portable_ops} == {"aten.cat"}
    gm, record = run_pass(ReshapeViews(), exported(model, x), x)
    assert record.rewrites == 1
    assert count(gm, aten.cat.default) == 0
    assert_equivalent(model, gm, x)
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


class NormThenScale(torch.nn.Module):
    """A LayerNorm over the last dim, then arithmetic: decompose_layer_norm reshapes its input
    to rows, its weight and bias to [M] and its result back, none of which changes a shape."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * 2


@pytest.mark.parametrize(("last", "kept"), [("scaled", 0), ("output", 1)])
def test_reshapes_to_the_inputs_own_shape_are_dropped_unless_an_output(
    last: str, kept: int
) -> None:
    """The norm's last reshape, when it is the graph's output, stays: an output is never its
    input's tensor."""
    from fxmobile.executorch.passes.decompose_layer_norm import DecomposeLayerNorm

    torch.manual_seed(0)
    scaled = NormThenScale().eval()
    torch.nn.init.normal_(scaled.norm.weight)
    torch.nn.init.normal_(scaled.norm.bias)
    model = scaled if last == "scaled" else scaled.norm
    x = torch.randn(2, 5, 8)
    gm, _ = run_pass(DecomposeLayerNorm(), exported(model, x), x)
    assert count(gm, aten.reshape.default) == 4
    gm, record = run_pass(ReshapeViews(), gm, x)
    assert record.rewrites == 4 - kept
    assert count(gm, aten.reshape.default) == kept
    assert_equivalent(model, gm, x)


def test_a_reshape_that_changes_the_shape_stays() -> None:
    model = Apply(lambda x: (x.reshape(4, 6) * 2).reshape(2, 3, 4)).eval()
    x = torch.randn(2, 3, 4)
    gm = exported(model, x)
    before = count(gm, aten.reshape.default) + count(gm, aten.view.default)
    gm, record = run_pass(ReshapeViews(), gm, x)
    assert record.rewrites == 0
    assert count(gm, aten.reshape.default) + count(gm, aten.view.default) == before == 2
    assert_equivalent(model, gm, x)
