"""The CPU kernels of every prepacked op match the ATen ops they stand for, on every path.

Each ``*_run`` op equals its eager reference, computed in float64: ``F.conv2d`` /
``F.conv_transpose2d`` / ``F.linear`` followed by ``clamp`` (bounds None, one-sided, both),
``F.conv1d``, ``F.layer_norm``, ``F.batch_norm``, ``torch.gru``, ``torch.lstm``. A conv or linear
kernel picks one of several paths per input (oneDNN on a channels-last or an NCHW input, a
GEMM, fxmobile's depthwise loop, ATen's own op); every check runs each path the kernel can take,
forced with ``fxmobile::force_kernel_path``, against the float64 reference and against ATen's
path in float32, so whichever path the rule picks, the numbers are within float rounding of
ATen's. Convolutions are swept (hypothesis, derandomized) over strides, padding, dilation,
groups (depthwise included), output padding, bias and both input memory formats; the explicit
cases below cover the rule's choice (``fxmobile::kernel_path``), each path's edge cases and the
refusals upstream makes.

Inputs holding NaN, +Inf or -Inf (some sweep draws, and one explicit test per op) give what ATen's
op and ``torch.clamp`` give: NaN wherever the reference has NaN (clamp keeps NaN; a fused clamp
built from max/min instructions turns it into a bound), the same infinity where it has one, and
the numbers elsewhere.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from fxmobile.backends.library import registration_status
from tests.helpers import assert_equivalent

ops = torch.ops
SWEEP = settings(max_examples=40, derandomize=True, database=None, deadline=None)
CLAMPS = [(None, None), (0.0, None), (None, 0.5), (-0.5, 0.5), (0.0, 6.0)]
Clamp = tuple[float | None, float | None]


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    registration_status()


def _rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# NaN, +Inf and -Inf, each written at an input position a draw picks.
NONFINITE = (float("nan"), float("inf"), float("-inf"))
Specials = tuple[tuple[float, int], ...]
SPECIALS = st.one_of(
    st.just(()),
    st.lists(
        st.tuples(st.sampled_from(NONFINITE), st.integers(0, 1 << 16)), min_size=1, max_size=3
    ).map(tuple),
)


def _with_specials(x: torch.Tensor, specials: Specials) -> torch.Tensor:
    """``x`` with each (value, position) of ``specials`` written at that flat position (modulo
    the size); positions are in ``x``'s logical (row-major) order, whatever its memory format."""
    flat = x.flatten().clone()
    for value, position in specials:
        flat[position % flat.numel()] = value
    return flat.view(x.shape)


def _clamped(y: torch.Tensor, clamp: Clamp) -> torch.Tensor:
    lo, hi = clamp
    return y if lo is None and hi is None else y.clamp(lo, hi)


def _d(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.double()


def _layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


# --- conv2d ------------------------------------------------------------------------------


def _conv2d_contexts(
    w: torch.Tensor,
    b: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    clamp: Clamp,
) -> dict[str, tuple[Any, Callable[[torch.Tensor, Any], torch.Tensor]]]:
    """The conv2d context of every family, prepacked with the same arguments, and its run op."""
    lo, hi = clamp
    return {
        "xnnpack": (
            ops.prepacked.conv2d_clamp_prepack(w, b, stride, padding, dilation, groups, lo, hi),
            ops.prepacked.conv2d_clamp_run,
        ),
        "vulkan": (
            ops.vulkan_prepack.create_conv2d_context(
                w, b, stride, padding, dilation, groups, lo, hi
            ),
            ops.vulkan_prepack.run_conv2d_context,
        ),
        "metal": (
            ops.metal_prepack.conv2d_prepack(w, b, stride, padding, dilation, groups, lo, hi),
            ops.metal_prepack.conv2d_run,
        ),
    }


def _forceable(ctx: Any, paths: tuple[str, ...]) -> list[str]:
    """The paths this context's kernel can take (forcing refuses the others)."""
    taken = []
    for path in paths:
        try:
            ops.fxmobile.force_kernel_path(ctx, path)
        except RuntimeError as e:
            assert "cannot take the path" in str(e)
            continue
        taken.append(path)
    ops.fxmobile.force_kernel_path(ctx, "auto")
    return taken


def _check_every_path(
    reference: Callable[[torch.Tensor], torch.Tensor],
    ctx: Any,
    run: Callable[[torch.Tensor, Any], torch.Tensor],
    x: torch.Tensor,
    paths: tuple[str, ...],
    where: str,
) -> list[str]:
    """Runs ``x`` on each path the kernel can take, and unforced: each matches the float64
    reference and ATen's path in float32, and keeps the input's memory format (4-D input).
    Returns the paths run."""
    taken = _forceable(ctx, paths)
    assert "aten" in taken
    ops.fxmobile.force_kernel_path(ctx, "aten")
    aten = run(x, ctx)
    ops.fxmobile.force_kernel_path(ctx, "auto")
    expected = reference(x)
    for path in [*taken, "auto"]:
        ops.fxmobile.force_kernel_path(ctx, path)
        try:
            y = run(x, ctx)
            _assert_matches(expected, y)
            _assert_matches(aten, y)
        except AssertionError as e:
            raise AssertionError(f"{where}, path {path}: {e}") from e
        finally:
            ops.fxmobile.force_kernel_path(ctx, "auto")
        channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
        if x.dim() == 4 and channels_last != x.is_contiguous():  # one layout, not both
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            assert y.is_contiguous(memory_format=fmt), (
                f"{where}, path {path}: the output does not keep the input's memory format"
            )
    return taken


def _assert_matches(expected: torch.Tensor, got: torch.Tensor) -> None:
    """``got`` has NaN where ``expected`` has NaN and the same infinity where it has one, and is
    within float rounding of it everywhere else (``assert_equivalent`` on the finite values)."""
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan), (
        f"NaN at {int(got.isnan().sum())} positions, expected at {int(nan.sum())} "
        f"({int((got.isnan() & ~nan).sum())} of them where a number is expected)"
    )
    inf = expected.isinf()
    same_inf = torch.equal(got.isinf(), inf) and torch.equal(
        got[inf].double(), expected[inf].double()
    )
    assert same_inf, (
        f"infinities at {int(got.isinf().sum())} positions, expected at {int(inf.sum())}"
    )
    finite = expected.isfinite()
    assert_equivalent(lambda: expected.where(finite, 0), lambda: got.where(finite, 0))


CONV_PATHS = ("aten", "onednn", "onednn_nchw", "gemm", "depthwise")
LINEAR_PATHS = ("aten", "gemm")


def _check_conv2d(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    clamp: Clamp,
) -> set[str]:
    """Every family's conv2d, on every path, against conv2d + clamp; returns the paths run."""

    def reference(x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x.double(), w.double(), _d(b), stride, padding, dilation, groups)
        return _clamped(y, clamp)

    taken: set[str] = set()
    contexts = _conv2d_contexts(w, b, stride, padding, dilation, groups, clamp)
    for family, (ctx, run) in contexts.items():
        taken |= set(_check_every_path(reference, ctx, run, x, CONV_PATHS, family))
    return taken


@st.composite
def conv2d_cases(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["dense", "grouped", "depthwise"]))
    if kind == "dense":
        groups, cin, cout = 1, draw(st.integers(1, 5)), draw(st.integers(1, 6))
    elif kind == "grouped":
        groups = draw(st.integers(2, 3))
        cin, cout = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    else:
        groups = cin = draw(st.integers(1, 8))
        cout = cin * draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    stride = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    padding = [draw(st.integers(0, 2)), draw(st.integers(0, 2))]
    dilation = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    size = [
        max(1, (k - 1) * d + 1 - 2 * p) + draw(st.integers(0, 6))
        for k, d, p in zip(kernel, dilation, padding, strict=True)
    ]
    return {
        "x": (draw(st.integers(1, 2)), cin, *size),
        "w": (cout, cin // groups, *kernel),
        "bias": draw(st.booleans()),
        "stride": stride,
        "padding": padding,
        "dilation": dilation,
        "groups": groups,
        "clamp": draw(st.sampled_from(CLAMPS)),
        "channels_last": draw(st.booleans()),
        "weight_channels_last": draw(st.booleans()),  # as fxmobile's channels-last pass stores it
        "specials": draw(SPECIALS),
    }


@SWEEP
@given(conv2d_cases())
def test_conv2d_sweep(case: dict[str, Any]) -> None:
    w = _layout(_rand(*case["w"], seed=1), case["weight_channels_last"])
    b = _rand(case["w"][0], seed=2) if case["bias"] else None
    x = _layout(_with_specials(_rand(*case["x"], seed=3), case["specials"]), case["channels_last"])
    _check_conv2d(
        x, w, b, case["stride"], case["padding"], case["dilation"], case["groups"], case["clamp"]
    )


@pytest.mark.parametrize("transposed", [False, True])
def test_a_channels_last_weight_is_packed_without_a_copy(transposed: bool) -> None:
    """The context keeps a channels-last weight as it is (its state is that very tensor): a
    contiguous copy would be a second copy of every weight fxmobile's channels-last pass
    stored, at optimization time and for as long as the module lives. Every path computes the
    same from it as from the contiguous weight."""
    shape = (8, 4, 3, 3)
    w = _layout(_rand(*shape, seed=7), True)
    x = _layout(_rand(1, 8, 9, 9, seed=8), True)
    if transposed:
        ctx = ops.prepacked.conv2d_transpose_clamp_prepack(
            w, None, [2, 2], [1, 1], [1, 1], [1, 1], 2, None, None
        )
        plain = ops.prepacked.conv2d_transpose_clamp_prepack(
            w.contiguous(), None, [2, 2], [1, 1], [1, 1], [1, 1], 2, None, None
        )
        run = ops.prepacked.conv2d_transpose_clamp_run
    else:
        ctx = ops.prepacked.conv2d_clamp_prepack(w, None, [1, 1], [1, 1], [1, 1], 2, None, None)
        plain = ops.prepacked.conv2d_clamp_prepack(
            w.contiguous(), None, [1, 1], [1, 1], [1, 1], 2, None, None
        )
        run = ops.prepacked.conv2d_clamp_run
    state, _class_name = ctx.__getstate__()
    assert state[0].data_ptr() == w.data_ptr()
    for path in _forceable(ctx, CONV_PATHS):
        ops.fxmobile.force_kernel_path(ctx, path)
        ops.fxmobile.force_kernel_path(plain, path)
        torch.testing.assert_close(run(x, ctx), run(x, plain), msg=path)
    ops.fxmobile.force_kernel_path(ctx, "auto")


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize(
    "size",
    [(1, 6, 3, 3), (1, 16, 12, 10), (2, 8, 9, 9), (1, 4, 30, 30), (1, 24, 30, 30), (1, 64, 64, 64)],
    ids=["tiny-image", "small", "batch2", "few-channels", "reducing", "large-input"],
)
@pytest.mark.parametrize("clamp", [(None, None), (0.0, 6.0)], ids=["noclamp", "relu6"])
def test_conv2d_1x1_paths(size: tuple[int, ...], channels_last: bool, clamp: Clamp) -> None:
    """1x1 convolutions (12 output channels) on each path (the GEMM on NCHW or channels-last
    data, oneDNN on NCHW or transposed to channels-last, ATen) match conv2d + clamp, and the
    output keeps the input's memory format, as eager's conv and upstream's XNNPACK ops do."""
    w, b = _rand(12, size[1], 1, 1, seed=4), _rand(12, seed=5)
    x = _layout(_rand(*size, seed=6), channels_last)
    taken = _check_conv2d(x, w, b, [1, 1], [0, 0], [1, 1], 1, clamp)
    assert taken == {"aten", "onednn", "onednn_nchw", "gemm"}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("size", "out_channels"),
    [((2, 48, 24, 24), 32), ((1, 96, 14, 14), 64)],
    ids=["many-pixels", "many-channels"],
)
def test_conv2d_1x1_nchw_gemm_threads(
    size: tuple[int, ...], out_channels: int, threads: int
) -> None:
    """The 1x1 NCHW GEMM, with one or two threads, on images with many pixels or channels."""
    w, b = _rand(out_channels, size[1], 1, 1, seed=46) * 0.1, _rand(out_channels, seed=47)
    x = _rand(*size, seed=48)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check_conv2d(x, w, b, [1, 1], [0, 0], [1, 1], 1, (-0.2, 0.3))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize(
    ("size", "kernel", "stride", "padding", "dilation"),
    [
        ((1, 16, 7, 7), 3, 1, 1, 1),  # direct loop: one register block of channels
        ((2, 19, 14, 14), 5, 1, 2, 1),  # direct: a 3-channel tail, two images
        ((1, 40, 14, 13), 3, 2, 0, 2),  # direct: stride, dilation, no padding
        ((1, 24, 4, 4), 3, 1, 2, 1),  # direct: taps outside the image on every side
        ((1, 32, 15, 15), 3, 1, 1, 1),  # 225 output pixels: oneDNN
    ],
    ids=["7x7", "tail-batch2", "strided-dilated", "all-padding", "onednn"],
)
@pytest.mark.parametrize("clamp", [(None, None), (0.0, 6.0), (-0.5, None)], ids=str)
def test_depthwise_direct_and_onednn_paths(
    size: tuple[int, ...],
    kernel: int,
    stride: int,
    padding: int,
    dilation: int,
    channels_last: bool,
    threads: int,
    clamp: Clamp,
) -> None:
    """Depthwise convolutions on small maps run fxmobile's direct loop, larger ones oneDNN; every
    path matches conv2d + clamp, and the output keeps the input's memory format."""
    c = size[1]
    w, b = _rand(c, 1, kernel, kernel, seed=60), _rand(c, seed=61)
    x = _layout(_rand(*size, seed=62), channels_last)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        taken = _check_conv2d(x, w, b, [stride] * 2, [padding] * 2, [dilation] * 2, c, clamp)
    finally:
        torch.set_num_threads(before)
    assert "depthwise" in taken and "onednn" in taken
    ctx = ops.prepacked.conv2d_clamp_prepack(w, b, [stride], [padding], [dilation], c, *clamp)
    small = size[2] * size[3] <= 14 * 14
    assert ops.fxmobile.kernel_path(ctx, x) == ("depthwise" if small else "onednn")


def test_depthwise_direct_path_propagates_nan() -> None:
    c = 18
    w = _rand(c, 1, 3, 3, seed=63)
    x = _rand(1, c, 5, 5, seed=64)
    x[0, 3, 2, 2] = float("nan")
    ctx = ops.prepacked.conv2d_clamp_prepack(w, None, [1], [1], [1], c, 0.0, 6.0)
    y = ops.prepacked.conv2d_clamp_run(x, ctx)
    expected = F.conv2d(x, w, None, 1, 1, 1, c).clamp(0.0, 6.0)
    assert torch.equal(y.isnan(), expected.isnan())
    assert int(y.isnan().sum()) == 9  # every output whose window holds the NaN


def test_conv2d_large_nchw_input_stays_nchw() -> None:
    """A large NCHW input is convolved by oneDNN as NCHW, not transposed first."""
    x = _rand(1, 16, 256, 256, seed=7)  # 2**20 elements
    w, b = _rand(16, 1, 3, 3, seed=8), _rand(16, seed=9)
    _check_conv2d(x, w, b, [2, 2], [1, 1], [1, 1], 16, (0.0, 6.0))
    ctx = ops.prepacked.conv2d_clamp_prepack(w, b, [2, 2], [1, 1], [1, 1], 16)
    assert ops.prepacked.conv2d_clamp_run(x, ctx).is_contiguous()


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_conv2d_single_channel_input(channels_last: bool) -> None:
    """One input channel, output width 1, horizontal stride 2: oneDNN's channels-last
    convolution gets this wrong, so the kernel must not send it there."""
    x = _layout(_rand(3, 1, 5, 4, seed=37), channels_last)
    w, b = _rand(2, 1, 2, 3, seed=38), _rand(2, seed=39)
    _check_conv2d(x, w, b, [1, 2], [0, 0], [1, 1], 1, (None, None))


def test_conv2d_any_strides_and_dtypes() -> None:
    w, b = _rand(4, 3, 3, 3, seed=10), _rand(4, seed=11)
    strided = _rand(2, 3, 12, 10, seed=12)[:, :, ::2]  # neither NCHW- nor channels-last-contiguous
    _check_conv2d(strided, w, b, [1, 1], [1, 1], [1, 1], 1, (0.0, None))
    # float64 throughout takes ATen's convolution
    x64, w64, b64 = (t.double() for t in (_rand(1, 3, 6, 6, seed=13), w, b))
    got = ops.prepacked.conv2d_clamp_run(
        x64, ops.prepacked.conv2d_clamp_prepack(w64, b64, [1], [1], [1], 1)
    )
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, F.conv2d(x64, w64, b64, 1, 1), rtol=1e-12, atol=1e-12)


def test_conv2d_accepts_parameters_and_int_params() -> None:
    conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
    ctx = ops.prepacked.conv2d_clamp_prepack(
        conv.weight, conv.bias, [2, 2], [1, 1], [1, 1], 1, 0, 6
    )
    x = _rand(1, 3, 9, 9, seed=14)
    with torch.no_grad():
        expected = conv(x).clamp(0, 6)
    torch.testing.assert_close(ops.prepacked.conv2d_clamp_run(x, ctx), expected)


def test_unordered_clamp_follows_torch_clamp() -> None:
    """Vulkan and Metal accept min > max; torch.clamp then gives max everywhere."""
    w = _rand(4, 3, 3, 3, seed=15)
    ctx = ops.vulkan_prepack.create_conv2d_context(w, None, [1, 1], [1, 1], [1, 1], 1, 1.0, -1.0)
    x = _rand(1, 3, 5, 5, seed=16)
    assert torch.equal(
        ops.vulkan_prepack.run_conv2d_context(x, ctx), torch.full((1, 4, 5, 5), -1.0)
    )


# --- the kernels' choice of path ----------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "w", "stride", "groups", "expected"),
    [
        ((1, 64, 1, 1), (16, 64, 1, 1), 1, 1, ("gemm", "gemm")),  # an SE block: tiny work
        ((1, 1280, 1, 1), (1000, 1280, 1, 1), 1, 1, ("gemm", "gemm")),  # one row
        ((1, 96, 4, 4), (576, 96, 1, 1), 1, 1, ("onednn", "onednn")),  # 0.9M multiply-adds
        ((1, 16, 112, 112), (96, 16, 1, 1), 1, 1, ("onednn_nchw", "onednn")),  # large output
        ((1, 3, 224, 224), (32, 3, 3, 3), 2, 1, ("onednn_nchw", "onednn")),  # RGB stem
        ((1, 128, 28, 28), (128, 128, 3, 3), 1, 1, ("onednn", "onednn")),  # mid-sized NCHW
        ((1, 128, 56, 56), (128, 4, 3, 3), 1, 32, ("onednn_nchw", "onednn")),  # resnext, g32
        ((1, 1024, 7, 7), (1024, 32, 3, 3), 1, 32, ("onednn", "onednn")),
        ((1, 576, 14, 14), (576, 1, 3, 3), 1, 576, ("depthwise", "depthwise")),
        ((1, 192, 28, 28), (192, 1, 3, 3), 2, 192, ("onednn_nchw", "onednn")),
    ],
    ids=str,
)
def test_rule_picks_the_measured_path(
    x: tuple[int, ...],
    w: tuple[int, ...],
    stride: int,
    groups: int,
    expected: tuple[str, str],
) -> None:
    """The path for NCHW and channels-last input, as conv2d.cpp's measurements chose it."""
    weight = _rand(*w, seed=70)
    pad = w[2] // 2
    ctx = ops.prepacked.conv2d_clamp_prepack(weight, None, [stride], [pad], [1], groups, 0.0)
    xin = torch.empty(x)
    cl = xin.contiguous(memory_format=torch.channels_last)
    assert (ops.fxmobile.kernel_path(ctx, xin), ops.fxmobile.kernel_path(ctx, cl)) == expected


def test_other_inputs_take_atens_path() -> None:
    ctx = ops.prepacked.conv2d_clamp_prepack(_rand(4, 8, 3, 3, seed=71), None, [1], [1], [1], 1)
    assert ops.fxmobile.kernel_path(ctx, torch.empty(1, 8, 9, 9)) == "onednn"
    assert ops.fxmobile.kernel_path(ctx, torch.empty(1, 8, 9, 9, dtype=torch.float64)) == "aten"
    assert ops.fxmobile.kernel_path(ctx, torch.empty(0, 8, 9, 9)) == "aten"
    ops.fxmobile.force_kernel_path(ctx, "onednn")  # a forced path is for float32 input only
    assert ops.fxmobile.kernel_path(ctx, torch.empty(1, 8, 9, 9, dtype=torch.float64)) == "aten"
    w64 = _rand(4, 3, 3, 3, seed=71, dtype=torch.float64)
    ctx64 = ops.prepacked.conv2d_clamp_prepack(w64, None, [1], [1], [1], 1)
    assert _forceable(ctx64, CONV_PATHS) == ["aten"]  # no fast path for a float64 weight
    lin = ops.prepacked.linear_clamp_prepack(_rand(5, 4, seed=72))
    assert ops.fxmobile.kernel_path(lin, torch.empty(2, 4)) == "gemm"
    assert ops.fxmobile.kernel_path(lin, torch.empty(2, 4, dtype=torch.float64)) == "aten"


def test_forcing_refuses_what_the_kernel_cannot_take() -> None:
    ctx = ops.prepacked.conv2d_clamp_prepack(_rand(4, 3, 3, 3, seed=73), None, [1], [1], [1], 1)
    with pytest.raises(
        RuntimeError,
        match="cannot take the path 'gemm'; it can take 'auto', 'aten', 'onednn', 'onednn_nchw'",
    ):
        ops.fxmobile.force_kernel_path(ctx, "gemm")
    with pytest.raises(RuntimeError, match="cannot take the path 'fast'"):
        ops.fxmobile.force_kernel_path(ctx, "fast")
    lin = ops.metal_prepack.linear_prepack(_rand(5, 4, seed=74), None)
    with pytest.raises(RuntimeError, match="linear layer cannot take the path 'onednn'"):
        ops.fxmobile.force_kernel_path(lin, "onednn")
    norm = ops.vulkan_prepack.create_layernorm_context(_rand(4, seed=75), _rand(4, seed=76), 1e-5)
    with pytest.raises(RuntimeError, match=r"LayernormPackedContext.* has no choice of kernel"):
        ops.fxmobile.kernel_path(norm, torch.empty(2, 4))
    with pytest.raises(RuntimeError, match="expected a prepacked conv or linear context"):
        ops.fxmobile.kernel_path(3, torch.empty(2, 4))
    with pytest.raises(RuntimeError, match="conv2d_clamp_run: expected a 4-D input"):
        ops.fxmobile.kernel_path(ctx, torch.empty(3, 8, 8))


def test_the_choice_is_not_pickled() -> None:
    """Forcing a path changes neither the state nor the saved file; a loaded context chooses
    by the rule again."""
    ctx = ops.prepacked.conv2d_clamp_prepack(_rand(4, 8, 3, 3, seed=77), None, [1], [1], [1], 1)
    holder = torch.jit.script(nn.Module())
    holder._c._register_attribute("ctx", ctx._type(), ctx)

    def saved() -> bytes:
        buffer = io.BytesIO()
        torch.jit.save(holder, buffer)
        return buffer.getvalue()

    before = saved()
    state = ctx.__getstate__()
    ops.fxmobile.force_kernel_path(ctx, "aten")
    x = torch.empty(1, 8, 9, 9)
    assert ops.fxmobile.kernel_path(ctx, x) == "aten"
    assert saved() == before
    assert str(ctx.__getstate__()) == str(state)
    loaded = torch.jit.load(io.BytesIO(before))
    assert ops.fxmobile.kernel_path(loaded.ctx, x) == "onednn"


# --- conv_transpose2d ---------------------------------------------------------------------


@st.composite
def tconv_cases(draw: st.DrawFn) -> dict[str, Any]:
    groups = draw(st.integers(1, 2))
    cin, cout_g = groups * draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    stride = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    dilation = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    padding = [draw(st.integers(0, (k - 1) * d)) for k, d in zip(kernel, dilation, strict=True)]
    output_padding = [
        draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation, strict=True)
    ]
    size = [draw(st.integers(1, 6)), draw(st.integers(1, 6))]
    for i in range(2):  # the output must not be empty
        out = (size[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1)
        assume(out + output_padding[i] + 1 >= 1)
    return {
        "x": (draw(st.integers(1, 2)), cin, *size),
        "w": (cin, cout_g, *kernel),
        "bias": draw(st.booleans()),
        "stride": stride,
        "padding": padding,
        "output_padding": output_padding,
        "dilation": dilation,
        "groups": groups,
        "clamp": draw(st.sampled_from(CLAMPS)),
        "channels_last": draw(st.booleans()),
        "specials": draw(SPECIALS),
    }


@SWEEP
@given(tconv_cases())
def test_conv_transpose2d_sweep(case: dict[str, Any]) -> None:
    w = _rand(*case["w"], seed=17)
    b = _rand(case["w"][1] * case["groups"], seed=18) if case["bias"] else None
    x = _layout(_with_specials(_rand(*case["x"], seed=19), case["specials"]), case["channels_last"])
    s, p, op, d, g = (
        case[k] for k in ("stride", "padding", "output_padding", "dilation", "groups")
    )
    lo, hi = case["clamp"]

    def reference(x: torch.Tensor) -> torch.Tensor:
        y = F.conv_transpose2d(x.double(), w.double(), _d(b), s, p, op, g, d)
        return _clamped(y, case["clamp"])

    xnn = ops.prepacked.conv2d_transpose_clamp_prepack(w, b, s, p, op, d, g, lo, hi)
    vk = ops.vulkan_prepack.create_tconv2d_context(w, b, s, p, op, d, g, lo, hi)
    run_xnn = ops.prepacked.conv2d_transpose_clamp_run
    _check_every_path(reference, xnn, run_xnn, x, CONV_PATHS, "xnnpack")
    run_vk = ops.vulkan_prepack.run_tconv2d_context
    _check_every_path(reference, vk, run_vk, x, CONV_PATHS, "vulkan")


# --- linear -------------------------------------------------------------------------------


@SWEEP
@given(
    st.integers(1, 40),
    st.integers(1, 40),
    st.sampled_from([(), (1,), (3,), (2, 3)]),
    st.booleans(),
    st.sampled_from(CLAMPS),
    SPECIALS,
)
def test_linear_sweep(
    in_f: int, out_f: int, lead: tuple[int, ...], bias: bool, clamp: Clamp, specials: Specials
) -> None:
    w, b = _rand(out_f, in_f, seed=20), (_rand(out_f, seed=21) if bias else None)
    x = _with_specials(_rand(*lead, in_f, seed=22), specials)
    lo, hi = clamp

    def reference(x: torch.Tensor) -> torch.Tensor:
        return _clamped(F.linear(x.double(), w.double(), _d(b)), clamp)

    xnn = ops.prepacked.linear_clamp_prepack(w, b, lo, hi)
    mtl = ops.metal_prepack.linear_prepack(w, b, lo, hi)
    for family, ctx, run in [
        ("xnnpack", xnn, ops.prepacked.linear_clamp_run),
        ("metal", mtl, ops.metal_prepack.linear_run),
    ]:
        assert _check_every_path(reference, ctx, run, x, LINEAR_PATHS, family) == ["aten", "gemm"]
    if clamp == (None, None):  # Vulkan linear has no clamp; its weight comes transposed
        vk = ops.vulkan_prepack.create_linear_context(w.t(), b)
        run_vk = ops.vulkan_prepack.run_linear_context
        _check_every_path(reference, vk, run_vk, x, LINEAR_PATHS, "vulkan")


@pytest.mark.parametrize("threads", [1, 2])
def test_linear_single_row_split_over_threads(threads: int) -> None:
    """A one-row input with a large weight takes the threaded GEMV path."""
    w, b = _rand(300, 512, seed=23), _rand(300, seed=24)
    x = _rand(1, 512, seed=25)
    ctx = ops.prepacked.linear_clamp_prepack(w, b, -1.0, 1.0)
    assert ops.fxmobile.kernel_path(ctx, x) == "gemm"
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check_every_path(
            lambda x: F.linear(x.double(), w.double(), b.double()).clamp(-1, 1),
            ctx,
            ops.prepacked.linear_clamp_run,
            x,
            LINEAR_PATHS,
            "xnnpack",
        )
    finally:
        torch.set_num_threads(before)


# --- NaN and infinities -------------------------------------------------------------------

NONFINITE_CLAMPS = [(None, None), (0.0, None), (0.0, 6.0), (-1.0, 1.0)]
NONFINITE_CLAMP_IDS = ["none", "relu", "relu6", "minus1-1"]


def _nonfinite_input(*shape: int, seed: int) -> torch.Tensor:
    """A random (N >= 2, C, H >= 4, W >= 4) input holding NaN, +Inf and -Inf: inside the map and
    at corners and edges (windows that reach into the padding), in the first, a middle and the
    last channel (a depthwise loop's register block and its tail), and in image 1 a +Inf and a
    -Inf in one window (NaN or an infinity there, by the weights' signs). The rest is finite."""
    x = _rand(*shape, seed=seed)
    _, c, h, w = shape
    nan, inf = float("nan"), float("inf")
    x[0, 0, 2, 2] = nan
    x[0, c - 1, 0, 0] = inf
    x[0, c // 2, h - 1, w - 2] = -inf
    x[1, 0, 1, w - 1] = inf
    x[1, c - 1, 2, w - 1] = -inf
    x[1, c // 2, h - 1, 0] = nan
    return x


# id: input shape, weight shape (IOHW when transposed), stride, padding, dilation, groups,
# output_padding (None: not transposed), the fast paths the kernel must take besides ATen's.
# oneDNN fuses the clamp behind a check of the input for the "expanding" ones (an output of at
# least twice the input's elements) and clamps its output afterwards for the others.
NONFINITE_CONVS: dict[str, tuple[Any, ...]] = {
    "3x3": ((2, 5, 7, 6), (7, 5, 3, 3), 1, 1, 1, 1, None, {"onednn", "onednn_nchw"}),
    "3x3-expanding": ((2, 3, 7, 6), (8, 3, 3, 3), 1, 1, 1, 1, None, {"onednn", "onednn_nchw"}),
    "3x3-strided-dilated": ((2, 4, 9, 8), (6, 4, 3, 3), 2, 2, 2, 1, None, {"onednn"}),
    "grouped": ((2, 6, 7, 6), (6, 2, 3, 3), 1, 1, 1, 3, None, {"onednn", "onednn_nchw"}),
    "depthwise": ((2, 18, 7, 6), (18, 1, 3, 3), 1, 1, 1, 18, None, {"onednn", "depthwise"}),
    "1x1": ((2, 6, 5, 4), (10, 6, 1, 1), 1, 0, 1, 1, None, {"onednn", "onednn_nchw", "gemm"}),
    "1x1-expanding": ((2, 6, 5, 4), (24, 6, 1, 1), 1, 0, 1, 1, None, {"onednn", "gemm"}),
    "transposed-expanding": ((2, 4, 5, 4), (4, 3, 3, 3), 2, 1, 1, 1, 1, {"onednn"}),
    "transposed-grouped": ((2, 4, 5, 4), (4, 2, 3, 3), 1, 1, 1, 2, 0, {"onednn"}),
}


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("clamp", NONFINITE_CLAMPS, ids=NONFINITE_CLAMP_IDS)
@pytest.mark.parametrize("conv", NONFINITE_CONVS.values(), ids=NONFINITE_CONVS.keys())
def test_every_conv_path_propagates_nan_and_inf_like_aten_clamp(
    conv: tuple[Any, ...], clamp: Clamp, channels_last: bool
) -> None:
    """On every path, an input holding NaN and infinities gives what ATen's conv2d /
    conv_transpose2d and then torch.clamp give: NaN stays NaN (a clamp fused as a max/min would
    turn it into a bound), an infinity becomes the bound it passes. The prepacked:: ops only:
    the other families run the same kernels (the sweeps above run them all on such inputs)."""
    shape, w_shape, s, p, d, g, output_padding, fast = conv
    transposed = output_padding is not None
    out_channels = w_shape[1] * g if transposed else w_shape[0]
    w, b = _rand(*w_shape, seed=100), _rand(out_channels, seed=101)
    x = _layout(_nonfinite_input(*shape, seed=102), channels_last)
    lo, hi = clamp
    if transposed:
        op = [output_padding] * 2
        ctx = ops.prepacked.conv2d_transpose_clamp_prepack(
            w, b, [s] * 2, [p] * 2, op, [d] * 2, g, lo, hi
        )
        run = ops.prepacked.conv2d_transpose_clamp_run

        def reference(x: torch.Tensor) -> torch.Tensor:
            y = F.conv_transpose2d(x.double(), w.double(), b.double(), s, p, op, g, d)
            return _clamped(y, clamp)
    else:
        ctx = ops.prepacked.conv2d_clamp_prepack(w, b, [s] * 2, [p] * 2, [d] * 2, g, lo, hi)
        run = ops.prepacked.conv2d_clamp_run

        def reference(x: torch.Tensor) -> torch.Tensor:
            return _clamped(F.conv2d(x.double(), w.double(), b.double(), s, p, d, g), clamp)

    expected = reference(x)
    assert expected.isnan().any() and expected.isfinite().any()
    taken = _check_every_path(reference, ctx, run, x, CONV_PATHS, "xnnpack")
    assert fast <= set(taken), f"took only {taken}"


@pytest.mark.parametrize("clamp", [(0.0, 6.0), (-1.0, 1.0)], ids=["relu6", "minus1-1"])
def test_a_clamped_path_is_torch_clamp_of_its_unclamped_output_when_sums_overflow(
    clamp: Clamp,
) -> None:
    """A finite input near float's largest value overflows the sums into infinities and, where
    a +Inf and a -Inf partial sum meet, NaN: how many and where depends on the order each path
    sums in (fused multiply-adds alone never make one), so the paths differ from one another and
    from float64, and no one reference fits them all. On every path of every geometry above, the
    clamped op is still exactly torch.clamp of the same path's unclamped output: a NaN that
    overflow made stays NaN, so a clamp is fused only where no sum can overflow."""
    lo, hi = clamp
    onednn_nans = 0
    for shape, w_shape, s, p, d, g, output_padding, _fast in NONFINITE_CONVS.values():
        w = _rand(*w_shape, seed=106) * 4
        x = _rand(*shape, seed=107).sign() * 3e38  # most products overflow, with either sign
        if output_padding is None:
            args: tuple[Any, ...] = ([s] * 2, [p] * 2, [d] * 2, g)
            prepack, run = ops.prepacked.conv2d_clamp_prepack, ops.prepacked.conv2d_clamp_run
        else:
            args = ([s] * 2, [p] * 2, [output_padding] * 2, [d] * 2, g)
            prepack = ops.prepacked.conv2d_transpose_clamp_prepack
            run = ops.prepacked.conv2d_transpose_clamp_run
        ctx, plain = prepack(w, None, *args, lo, hi), prepack(w, None, *args)
        for channels_last, path in itertools.product((False, True), _forceable(ctx, CONV_PATHS)):
            ops.fxmobile.force_kernel_path(ctx, path)
            ops.fxmobile.force_kernel_path(plain, path)
            xl = _layout(x, channels_last)
            unclamped = run(xl, plain)
            if path.startswith("onednn"):
                onednn_nans += int(unclamped.isnan().sum())
            torch.testing.assert_close(
                run(xl, ctx), unclamped.clamp(lo, hi), rtol=0, atol=0, equal_nan=True, msg=path
            )
    assert onednn_nans > 0  # oneDNN made some NaN (grouped NCHW and transposed inputs here)


@pytest.mark.parametrize("clamp", NONFINITE_CLAMPS, ids=NONFINITE_CLAMP_IDS)
@pytest.mark.parametrize(
    ("shape", "specials"),
    [
        ((4, 9), ((0, 3, "nan"), (1, 0, "inf"), (2, 8, "-inf"), (2, 4, "inf"))),
        ((2, 3, 9), ((0, 8, "nan"), (2, 2, "-inf"), (5, 5, "inf"))),
        ((1, 512), ((0, 7, "nan"),)),  # one row and a large weight: the split GEMV
        ((1, 512), ((0, 511, "-inf"),)),
    ],
    ids=["rows", "3-d", "gemv-nan", "gemv-inf"],
)
def test_every_linear_path_propagates_nan_and_inf_like_aten_clamp(
    shape: tuple[int, ...], specials: tuple[tuple[int, int, str], ...], clamp: Clamp
) -> None:
    """The linear kernel's paths, on inputs holding NaN and infinities (row, feature, value),
    give what F.linear and then torch.clamp give; the last row of a 2-D input stays finite."""
    in_f, out_f = shape[-1], 300 if shape[-1] == 512 else 7
    w, b = _rand(out_f, in_f, seed=103), _rand(out_f, seed=104)
    x = _rand(*shape, seed=105)
    for row, feature, value in specials:
        x.view(-1, in_f)[row, feature] = float(value)
    lo, hi = clamp

    def reference(x: torch.Tensor) -> torch.Tensor:
        return _clamped(F.linear(x.double(), w.double(), b.double()), clamp)

    assert not F.linear(x, w, b).isfinite().all()  # the special values reach the output
    xnn = ops.prepacked.linear_clamp_prepack(w, b, lo, hi)
    mtl = ops.metal_prepack.linear_prepack(w, b, lo, hi)
    for family, ctx, run in [
        ("xnnpack", xnn, ops.prepacked.linear_clamp_run),
        ("metal", mtl, ops.metal_prepack.linear_run),
    ]:
        assert _check_every_path(reference, ctx, run, x, LINEAR_PATHS, family) == ["aten", "gemm"]


# --- Vulkan-only kernels ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stride", "padding", "dilation", "groups", "bias"),
    [(1, 0, 1, 1, True), (2, 1, 1, 2, False), (1, 2, 2, 1, True), (3, 1, 2, 4, True)],
)
def test_conv1d(stride: int, padding: int, dilation: int, groups: int, bias: bool) -> None:
    w = _rand(8, 8 // groups, 3, seed=26)
    b = _rand(8, seed=27) if bias else None
    ctx = ops.vulkan_prepack.create_conv1d_context(w, b, [stride], [padding], [dilation], groups)
    x = _rand(2, 8, 13, seed=28)
    _check_every_path(
        lambda x: F.conv1d(x.double(), w.double(), _d(b), stride, padding, dilation, groups),
        ctx,
        ops.vulkan_prepack.run_conv1d_context,
        x,
        CONV_PATHS,
        "vulkan conv1d",
    )


@pytest.mark.parametrize("normalized", [[6], [4, 6]])
def test_layer_norm(normalized: list[int]) -> None:
    w, b = _rand(*normalized, seed=29), _rand(*normalized, seed=30)
    ctx = ops.vulkan_prepack.create_layernorm_context(w, b, 1e-3)
    x = _rand(2, 3, 4, 6, seed=31)
    assert_equivalent(
        lambda x: F.layer_norm(x.double(), normalized, w.double(), b.double(), 1e-3),
        lambda x: ops.vulkan_prepack.run_layernorm_context(x, normalized, ctx),
        x,
    )


@pytest.mark.parametrize("shape", [(4, 5), (2, 5, 7), (2, 5, 3, 3)])
def test_batch_norm(shape: tuple[int, ...]) -> None:
    w, b, mean = (_rand(5, seed=s) for s in (32, 33, 34))
    var = _rand(5, seed=35).abs() + 0.1
    ctx = ops.vulkan_prepack.create_batchnorm_context(w, b, mean, var, False, 0.1, 1e-5, True)
    x = _rand(*shape, seed=36)
    assert_equivalent(
        lambda x: F.batch_norm(
            x.double(), mean.double(), var.double(), w.double(), b.double(), False, 0.1, 1e-5
        ),
        lambda x: ops.vulkan_prepack.run_batchnorm_context(x, ctx),
        x,
    )


def _rnn_params(layers: int, gates: int, inp: int, hidden: int) -> list[torch.Tensor]:
    params = []
    for layer in range(layers):
        size_in = inp if layer == 0 else hidden
        params += [
            _rand(gates * hidden, size_in, seed=40 + layer),
            _rand(gates * hidden, hidden, seed=50 + layer),
            _rand(gates * hidden, seed=60 + layer),
            _rand(gates * hidden, seed=70 + layer),
        ]
    return params


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize(("batch", "seq", "batch_first"), [(3, 5, True), (1, 1, False)])
def test_gru(layers: int, batch: int, seq: int, batch_first: bool) -> None:
    params = _rnn_params(layers, 3, 4, 6)
    ctx = ops.vulkan_prepack.create_gru_context(
        params, True, layers, 0.0, False, False, batch_first
    )
    x, h = _rand(batch, seq, 4, seed=80), _rand(layers, batch, 6, seed=81)
    p64 = [p.double() for p in params]
    assert_equivalent(
        lambda x, h: torch.gru(
            x.double(), h.double(), p64, True, layers, 0.0, False, False, batch_first
        ),
        lambda x, h: ops.vulkan_prepack.run_gru_context(x, h, ctx),
        x,
        h,
    )


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize(("batch", "seq", "batch_first"), [(3, 5, True), (1, 1, False)])
def test_lstm(layers: int, batch: int, seq: int, batch_first: bool) -> None:
    params = _rnn_params(layers, 4, 4, 6)
    ctx = ops.vulkan_prepack.create_lstm_context(
        params, True, layers, 0.0, False, False, batch_first
    )
    x = _rand(batch, seq, 4, seed=82)
    h, c = _rand(layers, batch, 6, seed=83), _rand(layers, batch, 6, seed=84)
    p64 = [p.double() for p in params]
    assert_equivalent(
        lambda x, h, c: torch.lstm(
            x.double(), (h.double(), c.double()), p64, True, layers, 0.0, False, False, batch_first
        ),
        lambda x, h, c: ops.vulkan_prepack.run_lstm_context(x, h, c, ctx),
        x,
        h,
        c,
    )


# --- sizes ops and refusals ---------------------------------------------------------------


def test_unpack_prepacked_sizes() -> None:
    conv = ops.prepacked.conv2d_clamp_prepack(
        _rand(6, 2, 3, 1, seed=90), _rand(6, seed=91), [2, 1], [1, 0], [1, 1], 2, 0.0, 6.0
    )
    assert ops.prepacked.unpack_prepacked_sizes_conv2d(conv) == (
        [6, 2, 3, 1],
        [6],
        [2, 1],
        [1, 0],
        [1, 1],
        2,
    )
    lin = ops.prepacked.linear_clamp_prepack(_rand(5, 7, seed=92))
    assert ops.prepacked.unpack_prepacked_sizes_linear(lin) == ([5, 7], None)
    with pytest.raises(RuntimeError, match=r"expected a xnnpack\.Conv2dOpContext"):
        ops.prepacked.unpack_prepacked_sizes_conv2d(lin)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: ops.prepacked.linear_clamp_prepack(_rand(3, 2, seed=1), None, 1.0, 1.0),
            "linear_clamp_prepack: output_max must be greater than output_min",
        ),
        (
            lambda: ops.prepacked.conv2d_clamp_prepack(
                _rand(3, 2, 3, seed=1), None, [1], [0], [1], 1
            ),
            "conv2d_clamp_prepack: expected a 4-D weight",
        ),
        (
            lambda: ops.prepacked.conv2d_clamp_run(
                _rand(1, 5, 4, 4, seed=1),
                ops.prepacked.conv2d_clamp_prepack(
                    _rand(3, 2, 1, 1, seed=1), None, [1], [0], [1], 1
                ),
            ),
            "conv2d_clamp_run: the input has 5 channels",
        ),
        (
            lambda: ops.prepacked.linear_clamp_run(
                _rand(2, 3, seed=1), ops.prepacked.linear_clamp_prepack(_rand(4, 2, seed=1))
            ),
            "linear_clamp_run: expected an input whose last dimension is in_features = 2",
        ),
        (
            lambda: ops.vulkan_prepack.create_layernorm_context(None, None, 1e-5),
            "create_layernorm_context: Weight must be provided",
        ),
        (
            lambda: ops.vulkan_prepack.create_gru_context(
                _rnn_params(1, 3, 2, 2), True, 1, 0.0, False, True, True
            ),
            "expects 'bidirectional' to be false",
        ),
        (
            lambda: ops.vulkan_prepack.create_lstm_context(
                _rnn_params(1, 4, 2, 2), True, 2, 0.0, False, False, True
            ),
            "expects 'params_cpu' size to be 4 \\* 'num_layers'",
        ),
        (
            lambda: ops.vulkan_prepack.run_gru_context(
                _rand(2, 3, 2, seed=1),
                _rand(1, 3, 2, seed=2),
                ops.vulkan_prepack.create_gru_context(
                    _rnn_params(1, 3, 2, 2), True, 1, 0.0, False, False, False
                ),
            ),
            "expects batch-first input",
        ),
        (
            lambda: ops.vulkan_prepack.run_conv1d_context(
                _rand(1, 4, 4, 4, seed=1),
                ops.vulkan_prepack.create_conv1d_context(
                    _rand(4, 4, 1, seed=1), None, [1], [0], [1], 1
                ),
            ),
            "run_conv1d_context: expected a 3-D input",
        ),
    ],
    ids=[
        "empty-clamp-range",
        "conv-weight-rank",
        "conv-input-channels",
        "linear-in-features",
        "layernorm-no-weight",
        "gru-bidirectional",
        "lstm-params-count",
        "gru-not-batch-first",
        "conv1d-input-rank",
    ],
)
def test_refusals_name_the_op_and_the_problem(call: Callable[[], object], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        call()


def test_quantized_vulkan_conv_state_is_refused() -> None:
    ctx = ops.vulkan_prepack.create_conv2d_context(
        _rand(2, 2, 1, 1, seed=1), None, [1], [0], [1], 1
    )
    state = ctx._get_method("__getstate__")()
    state[6] = True  # the "quantized" flag of create_qconv2d_context
    with pytest.raises(RuntimeError, match=r"quantized Vulkan convolutions .* are not supported"):
        ctx._get_method("__setstate__")(state)
