"""Hand-written fuzz programs: the shrunk models on which the oracle was once too tight.

Each is a ``ModelSpec`` as the generator would draw it, so it runs through ``check_model``
exactly as a drawn model does.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.fuzz.spec import Block, Kind, Layout, ModelSpec, Value


def _unit_stride_conv(out_channels: int, kernel: tuple[int, int], **extra: Any) -> dict[str, Any]:
    """Options of a stride-1, unpadded, ungrouped conv without bias, as the generator writes
    them (``extra``: dilation, padding_mode, output_padding)."""
    options = {"out_channels": out_channels, "kernel": kernel, "stride": (1, 1)}
    options |= {"padding": (0, 0), "dilation": extra.pop("dilation", (1, 1)), "groups": 1}
    return {**options, "bias": False, **extra}


def batch_statistics_after_a_bn_chain() -> ModelSpec:
    """The program the long profile shrank to: a 1x1 conv, a chain of BNs on running
    statistics (the function form called twice with the same tensors), then a BN on batch
    statistics with a small eps."""
    x = Value(5, (3, 8), torch.float32)
    bn = {"eps": 0.1, "affine": "parameter"}
    conv = _unit_stride_conv(5, (1, 1), padding_mode="zeros")
    blocks = (
        Block(Kind.CONV, "module", 0, x, conv),
        Block(Kind.BATCHNORM, "function", 1, x, bn),
        Block(Kind.ACTIVATION, "module", 2, x, {"op": "relu", "inplace": False}),
        Block(Kind.BATCHNORM, "function", 3, x, {**bn, "alias": False}, owner=1),
        Block(
            Kind.BATCHNORM,
            "module",
            4,
            x,
            {"eps": 0.1, "affine": False, "track_running_stats": True},
        ),
        Block(Kind.BATCHNORM, "function_batch_stats", 5, x, {"eps": 0.0004, "affine": "parameter"}),
    )
    return ModelSpec(x, 2, Layout.CONTIGUOUS, blocks, (6,), seed=0)


def batch_statistics_of_clamped_values() -> ModelSpec:
    """The long profile's third false alarm: a BN on batch statistics of clamped values."""
    x = Value(3, (5, 7), torch.float32)
    bn = {"eps": 0.1, "affine": False, "track_running_stats": True}
    relu = {"op": "relu", "inplace": False}
    up = _unit_stride_conv(1, (1, 1), output_padding=(0, 0))
    blocks = (
        Block(Kind.BATCHNORM, "module", 0, x, bn),
        Block(Kind.ACTIVATION, "module", 1, x, relu),
        Block(Kind.ACTIVATION, "module", 2, x, relu),
        Block(Kind.BATCHNORM, "module", 3, x, bn),
        Block(Kind.ACTIVATION, "module", 4, x, {**relu, "op": "hardtanh", "min": 0.0, "max": 1.4}),
        Block(Kind.BATCHNORM, "module", 5, x, {**bn, "eps": 0.013, "track_running_stats": False}),
        Block(Kind.CONV_TRANSPOSE, "module", 6, Value(1, (5, 7), torch.float32), up),
    )
    return ModelSpec(x, 2, Layout.CONTIGUOUS, blocks, (7,), seed=0)


def batch_statistics_of_a_clamp_in_place() -> ModelSpec:
    """The fourth: BNs on batch statistics around an in-place clamp to a narrow band, the
    same BN module called at three sites."""
    x = Value(1, (3, 5), torch.float32)
    y = Value(2, (3, 9), torch.float32)
    up = _unit_stride_conv(2, (1, 3), dilation=(1, 2), output_padding=(0, 0))
    bn = {"eps": 0.1, "affine": False, "track_running_stats": False}
    again = {**bn, "alias": False}
    clamp = {"op": "hardtanh", "inplace": True, "min": -0.75, "max": -0.7}
    blocks = (
        Block(Kind.CONV_TRANSPOSE, "module", 0, y, up),
        Block(Kind.BATCHNORM, "module", 1, y, bn),
        Block(Kind.BATCHNORM, "module", 2, y, again, owner=1),
        Block(Kind.ACTIVATION, "module", 3, y, clamp),
        Block(Kind.BATCHNORM, "module", 4, y, again, owner=1),
        Block(Kind.ACTIVATION, "module", 5, y, {"op": "relu", "inplace": False}),
    )
    return ModelSpec(x, 2, Layout.STRIDED, blocks, (6,), seed=0)


def batch_statistics_fed_nchw_by_eager() -> ModelSpec:
    """The fifth (fx-channels-last, seed 2027): a depthwise transposed conv returns NCHW in
    eager even from a channels-last input, so only the channels-last rewrite hands the BN on
    batch statistics a channels-last tensor, whose kernel sums in another order (7.7e-6 from
    the float64 anchor on the same float32 input, against 3.9e-7 NCHW)."""
    x = Value(1, (5, 5), torch.float32)
    y = Value(16, (3, 6), torch.float32)
    up = {**_unit_stride_conv(8, (1, 2), output_padding=(0, 0)), "padding": (1, 0), "bias": True}
    depthwise = {**_unit_stride_conv(16, (1, 1), output_padding=(0, 0)), "groups": 16}
    bn = {"eps": 0.1, "affine": False, "track_running_stats": True}
    blocks = (
        Block(Kind.CONV_TRANSPOSE, "module", 0, Value(8, (3, 6), torch.float32), up),
        Block(Kind.BINARY, "list", 1, y, {"op": "cat"}, other=1),
        Block(Kind.CONV_TRANSPOSE, "function", 2, y, {**depthwise, "storage": "parameter"}),
        Block(Kind.ACTIVATION, "module", 3, y, {"op": "relu", "inplace": False}),
        Block(Kind.BATCHNORM, "module", 4, y, bn),
        Block(Kind.BATCHNORM, "module", 5, y, {**bn, "track_running_stats": False}),
    )
    return ModelSpec(x, 2, Layout.CONTIGUOUS, blocks, (6,), seed=2)
