"""``make demo``: optimize a built-in default model for the CPU and show what happened.

The default is torchvision's mobilenet_v2 with random weights (nothing is downloaded), its
BatchNorm statistics randomized so folding is really exercised. It prints the report of both
stages, then the lite-interpreter file's output against eager and the latency of each.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.jit.mobile

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


def _median_ms(fn: Callable[[], object], runs: int = 15) -> float:
    with torch.no_grad():
        fn()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(2)
    model = _randomized_mobilenet_v2()
    x = torch.randn(1, 3, 224, 224)
    start = time.perf_counter()
    result = fxmobile.optimize(model, example_inputs=x, backend="CPU")
    print(result.report)
    print(f"\noptimized in {time.perf_counter() - start:.1f} s")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mobilenet_v2.ptl"
        result.save(path)
        lite = torch.jit.mobile._load_for_lite_interpreter(str(path))
    with torch.no_grad():
        expected = model(x)
    err = float((lite(x) - expected).abs().max())
    print(
        f"lite interpreter vs eager: max abs error {err:.3g} (eager max {expected.abs().max():.3g})"
    )
    eager_ms = _median_ms(lambda: model(x))
    optimized_ms = _median_ms(lambda: result.module(x))
    lite_ms = _median_ms(lambda: lite(x))
    print(
        f"median latency, batch 1, 2 threads: eager {eager_ms:.1f} ms, optimized TorchScript "
        f"{optimized_ms:.1f} ms, lite interpreter {lite_ms:.1f} ms"
    )


if __name__ == "__main__":
    main()
