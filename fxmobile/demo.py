"""``make demo``: optimize a built-in default model and print what happened.

The default is torchvision's mobilenet_v2 with random weights (nothing is downloaded), its
BatchNorm statistics randomized so folding is really exercised.
"""

from __future__ import annotations

import time

import torch

import fxmobile


def _randomized_mobilenet_v2() -> torch.nn.Module:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(weights=None)
    model.train()
    with torch.no_grad():  # a few training-mode forwards give BN non-trivial running stats
        for _ in range(3):
            model(torch.randn(4, 3, 224, 224) * 2 + 0.5)
    return model.eval()


def main() -> None:
    model = _randomized_mobilenet_v2()
    example = torch.randn(1, 3, 224, 224)
    start = time.perf_counter()
    result = fxmobile.optimize_fx(model, example)
    elapsed = time.perf_counter() - start
    print(result.report)
    print(f"\noptimize_fx took {elapsed:.2f} s")


if __name__ == "__main__":
    main()
