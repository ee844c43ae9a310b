"""The optimized model on an input beyond the example (issue 24): what the check runs it on once
the example has passed.

fxmobile captures the model on the example input, and its gate checks fresh values and another
layout of it; the fuzzer then runs the optimized module and eager on one more input
(``ModelSpec.probe``, drawn):

- **nonfinite**: the example with about one entry in eight set to NaN, +inf or -inf. NaN must
  come out where eager's does, infinities as eager's, and the finite elements within the
  example's rounding bound (``assert_nonfinite_like_eager``);
- **channels_last** / **strided**: the example's values channels-last (contiguous when the
  example is channels-last) or as every other element of a wider buffer (contiguous when the
  example is strided), checked against their own float64 anchor and rounding noise; not where
  the model writes through a view that reads the memory order (eager itself computes
  something else in another layout there, and a prepacked op may return other strides);
- **batch**: three samples instead of the example's one or two, where the model takes them (no
  constant shaped by the batch, no write through a view indexed by it). A module a route fixed
  to the example's shapes (shape-aware tracing, ``torch.jit.trace``) may refuse the call,
  with an error that says so, but never return something else.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from hypothesis import event

from tests.fuzz.oracle import (
    assert_close_to_anchor,
    assert_nonfinite_like_eager,
    in_dtype,
    layout_sensitive_writes,
    results,
    rounding_noise,
)
from tests.fuzz.spec import Kind, Layout, ModelSpec

PROBES = ("nonfinite", "channels_last", "strided", "batch")
PROBE_BATCH = 3
# what a module fixed to the example's shapes says when called with others
SPECIALIZED = {
    "torch.fx (shape-aware)": "specialized this model to input",
}


def probe_spec(spec: ModelSpec) -> ModelSpec | None:
    """The spec whose input is the probe's (None: the model does not take that input)."""
    probe = spec.probe
    if probe == "nonfinite":
        return replace(spec, probe=None, nonfinite=True)
    if probe in ("channels_last", "strided"):
        if spec.reads_memory_order() or layout_sensitive_writes(spec) or spec.input.extra_dim:
            return None
        wanted = Layout.CHANNELS_LAST if probe == "channels_last" else Layout.STRIDED
        layout = Layout.CONTIGUOUS if spec.layout is wanted else wanted
        return replace(spec, probe=None, layout=layout)
    if probe == "batch":
        by_batch = any(
            b.kind is Kind.VIEW_WRITE
            or (b.kind is Kind.ARITHMETIC and b.options.get("const") == "batch")
            for b in spec.blocks
        )
        return None if by_batch else replace(spec, probe=None, batch=PROBE_BATCH)
    return None


def check_probe(
    spec: ModelSpec,
    model: Any,
    module: Any,
    route: str,
    noise: list[float],
    ref64: list[torch.Tensor],
) -> None:
    """``module`` (the optimized ``model``) against eager on the probe's input; ``noise`` and
    ``ref64`` are the example's."""
    probed = probe_spec(spec)
    if probed is None:
        if spec.probe:
            event(f"probe {spec.probe}: not taken by this model")
        return
    try:
        eager = results(model, probed)
    except RuntimeError:  # eager refuses it (a BN on batch statistics of one value...)
        event(f"probe {spec.probe}: eager refuses it")
        return
    if probed.nonfinite:
        got = results(module, probed)
        for i, (g, e, n, r) in enumerate(zip(got, eager, noise, ref64, strict=True)):
            scale = float(r.abs().max()) if r.numel() else 0.0
            assert_nonfinite_like_eager(g, e, n, scale, _where(i, len(got), spec.probe))
        event("probe nonfinite: checked")
        return
    if not all(bool(t.isfinite().all()) for t in eager):
        event(f"probe {spec.probe}: eager is not finite")
        return
    anchor = [t.double() for t in results(in_dtype(model, torch.float64), probed, torch.float64)]
    probe_noise = rounding_noise(model, probed, eager, anchor)
    try:
        got = results(module, probed)
    except Exception as exc:
        words = next((w for r, w in SPECIALIZED.items() if route.startswith(r)), None)
        fixed = route == "torch.jit.trace" or (words is not None and words in str(exc))
        if spec.probe != "batch" or not fixed:
            raise AssertionError(
                f"the optimized module fails on the probe's input ({spec.probe}) where eager "
                f"runs: {type(exc).__name__}: {exc}"
            ) from exc
        event(f"probe batch: refused by a module fixed to the example's shapes ({route})")
        return
    for i, (g, e, r, n) in enumerate(zip(got, eager, anchor, probe_noise, strict=True)):
        where = _where(i, len(got), spec.probe)
        assert g.dtype == e.dtype, f"{where} is {g.dtype}, eager's {e.dtype}"
        assert_close_to_anchor(g, r, n, e.dtype, where)
    event(f"probe {spec.probe}: checked")


def _where(i: int, count: int, probe: str | None) -> str:
    what = "the input after the call" if i == count - 1 else f"output {i}"
    return f"{what} (probe {probe})"
