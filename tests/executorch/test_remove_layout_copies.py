"""``remove_layout_copies``: copies that only change the memory format, removed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from fxmobile.executorch.passes.remove_layout_copies import RemoveLayoutCopies
from tests.export_helpers import Apply, aten, exported, program_of, run_pass

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")

CL = torch.channels_last


def layout_copies(gm: torch.fx.GraphModule) -> int:
    """Copies in ``gm`` that set a memory format."""
    copies = (aten.clone.default, aten._to_copy.default)
    return sum(
        1
        for n in gm.graph.nodes
        if n.target in copies and n.kwargs.get("memory_format") not in (None, torch.preserve_format)
    )


CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    # flatten copies a channels-last tensor into a contiguous one: the output is contiguous
    "contiguous": lambda x: (x.contiguous(memory_format=CL) * 2.0).flatten(1),
    "to": lambda x: (x.to(memory_format=CL) * 2.0).flatten(1),
    "permuted-contiguous": lambda x: x.permute(0, 2, 3, 1).contiguous().sum(-1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_layout_copy_goes_and_the_values_stay(case: str) -> None:
    torch.manual_seed(0)
    model, x = Apply(CASES[case]).eval(), torch.randn(2, 3, 4, 5)
    gm = exported(model, x)
    copies = layout_copies(gm)  # flatten's own copy to contiguous among them
    assert copies >= 1
    gm, record = run_pass(RemoveLayoutCopies(), gm, x)
    assert record.rewrites == copies
    assert layout_copies(gm) == 0
    assert torch.equal(gm(x), model(x))


def test_a_dtype_change_with_the_layout_keeps_the_dtype_change() -> None:
    model = Apply(lambda x: (x.to(torch.float64, memory_format=CL) * 2.0).flatten(1)).eval()
    x = torch.randn(2, 3, 4, 5)
    gm, record = run_pass(RemoveLayoutCopies(), exported(model, x), x)
    assert record.rewrites == 2  # the cast's layout, and flatten's copy to contiguous
    assert layout_copies(gm) == 0
    casts = [n for n in gm.graph.nodes if n.target is aten._to_copy.default]
    assert [n.kwargs for n in casts] == [{"dtype": torch.float64}]
    assert gm(x).dtype is torch.float64
    assert torch.equal(gm(x), model(x))


def test_a_copy_the_graph_returns_keeps_its_layout() -> None:
    model, x = (
        Apply(lambda x: (x * 2.0).permute(0, 2, 3, 1).contiguous()).eval(),
        torch.randn(1, 3, 4, 5),
    )
    gm, record = run_pass(RemoveLayoutCopies(), exported(model, x), x)
    reason = "the graph returns it: the program's output keeps the layout eager gives it"
    assert (record.rewrites, record.skips) == (0, {reason: 1})
    assert gm(x).is_contiguous()


def test_a_channels_last_output_keeps_every_layout_copy() -> None:
    model = Apply(lambda x: torch.relu(x.contiguous(memory_format=CL)) * 2.0).eval()
    x = torch.randn(1, 3, 4, 5)
    gm, record = run_pass(RemoveLayoutCopies(), exported(model, x), x)
    reason = "the graph returns a torch.channels_last tensor: the program returns it in that layout"
    assert (record.rewrites, record.skips) == (0, {reason: 1})
    assert gm(x).is_contiguous(memory_format=CL)


class ChannelsLastStem(nn.Module):
    """A model that makes its activations channels-last inside ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x.contiguous(memory_format=CL))).flatten(1)


def test_channels_last_inside_the_model_lowers_to_one_delegate_call() -> None:
    torch.manual_seed(0)
    model, x = ChannelsLastStem().eval(), torch.randn(1, 3, 6, 6)
    before = program_of(exported(model, x), x)
    assert "dim_order_ops._clone_dim_order" in {p.op for p in before.portable_ops}
    gm, record = run_pass(RemoveLayoutCopies(), exported(model, x), x)
    assert record.rewrites == 2  # to channels-last, and flatten's copy back
    after = program_of(gm, x)
    assert (after.delegate_calls, after.portable_ops) == (1, ())


def test_regression_a_reshape_of_a_split_part_still_runs_without_its_clone() -> None:
    """torch.export records ``v.reshape(...)`` of a split's part as ``clone`` (to contiguous)
    then ``_unsafe_view``; with the clone removed the view was left on strides it cannot take,
    and the next pass that ran the graph raised "view size is not compatible" (yolo11n and
    Hugging Face's MobileViT failed on the ExecuTorch target where ExecuTorch's own flow went
    through). ``rewritable`` makes ``_unsafe_view`` a ``reshape``, as it does ``view``."""

    def reshaped_part(x: torch.Tensor) -> torch.Tensor:
        _, _, v = x.split([4, 4, 4], dim=2)
        return v.reshape(1, 8, 4, 4) * 2

    torch.manual_seed(0)
    model, x = Apply(reshaped_part).eval(), torch.randn(1, 2, 12, 16)
    gm, record = run_pass(RemoveLayoutCopies(), exported(model, x), x)
    assert record.rewrites == 1
    assert torch.equal(gm(x), model(x))


@pytest.mark.slow
def test_regression_timm_mobilenetv4_hybrid_large_lowers_with_its_attention_copies() -> None:
    """Its attention, which decompose_sdpa leaves, is transposed and reshaped; export copies it
    to contiguous first. With that copy removed, ExecuTorch's lowering decomposed the attention
    into another layout and made the reshape a view of strides it cannot take ("Cannot view a
    tensor with shape [1, 576, 8, 48]"), where ExecuTorch's own flow goes through (33 delegate
    calls, 144 portable ops)."""
    timm = pytest.importorskip("timm")
    import fxmobile

    model = timm.create_model("mobilenetv4_hybrid_large").eval()
    x = torch.randn(1, 3, 384, 384)
    result = fxmobile.optimize(model, example_inputs=x, target_runtime="executorch")
    program = result.report.program
    assert program is not None and result.report.numerics_passed
    assert program.delegate_calls < 33 and program.portable_count < 144
