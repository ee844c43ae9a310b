"""Small models that tests of more than one file run: a pass's own test file and a backend's
end-to-end tests check the same model at their two depths."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DynamicWeight(nn.Module):
    """A linear whose weight is computed from the input: no constant to prepack."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w * x.mean())


class TwoInputs(nn.Module):
    """A used tensor input, an unused one and a flag: what the GPU transfer moves."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, unused: torch.Tensor, flag: bool) -> torch.Tensor:
        y = self.conv(x)
        if flag:
            y = y + 1
        return y


class Recurrent(nn.Module):
    """A two-layer GRU into an LSTM."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 6, num_layers=2, batch_first=True)
        self.lstm = nn.LSTM(6, 5, batch_first=True)

    def forward(
        self, x: torch.Tensor, h: torch.Tensor, h2: torch.Tensor, c2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        y, hn = self.gru(x, h)
        z, (a, b) = self.lstm(y, (h2, c2))
        return z, hn, a, b
