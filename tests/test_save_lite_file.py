"""MobileResult.save writes only files the lite interpreter loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile.errors import ScriptingError


class MixedDict(nn.Module):
    """YOLO's head returns (y, {"boxes": t, "feats": [t, ...]}): a Union the lite interpreter's
    type parser cannot read back."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | list[torch.Tensor]]]:
        y = self.conv(x)
        return y, {"boxes": y, "feats": [y, y]}


def test_a_file_the_lite_interpreter_cannot_read_is_refused_and_not_written(tmp_path: Path) -> None:
    x = torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(MixedDict().eval(), example_inputs=x)
    target = tmp_path / "mixed.ptl"
    with pytest.raises(ScriptingError, match="the lite interpreter cannot load MixedDict's file"):
        result.save(target)
    assert not target.exists()


def test_a_plain_file_is_written_and_loads(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    target = tmp_path / "plain.ptl"
    fxmobile.optimize(model, example_inputs=x).save(target)
    lite = torch.jit.mobile._load_for_lite_interpreter(str(target))
    torch.testing.assert_close(lite(x), model(x))
