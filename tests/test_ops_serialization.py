"""Prepacked contexts pickle exactly like upstream's and survive save/load in both formats.

For every context class: ``__getstate__`` has upstream's type (a tuple for XNNPACK and Metal, a
list for Vulkan) and returns upstream's elements in upstream's order (the prepack arguments as
given); a scripted module holding the context as an attribute gives identical outputs after
``torch.jit.save``/``torch.jit.load`` and after ``_save_for_lite_interpreter``/
``_load_for_lite_interpreter``; and graphs whose prepack call was folded into a constant do too.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.jit.mobile import _load_for_lite_interpreter

from fxmobile.backends.library import registration_status

ops = torch.ops


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    registration_status()


def _t(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _gru_params(layers: int, gates: int, inp: int, hidden: int) -> list[torch.Tensor]:
    params = []
    for layer in range(layers):
        size_in = inp if layer == 0 else hidden
        params += [
            _t(gates * hidden, size_in, seed=10 * layer),
            _t(gates * hidden, hidden, seed=10 * layer + 1),
            _t(gates * hidden, seed=10 * layer + 2),
            _t(gates * hidden, seed=10 * layer + 3),
        ]
    return params


@dataclass(frozen=True)
class Case:
    """A context, the state upstream would pickle for it, and a forward that runs it."""

    cls: str
    make: Callable[[], tuple[Any, Any]]  # -> (context, upstream state)
    state_type: str  # upstream's __getstate__ return type
    forward: str  # TorchScript source of a forward method using self.ctx
    inputs: Callable[[], tuple[Any, ...]]


W_CONV, B_CONV = _t(6, 1, 3, 3, seed=1), _t(6, seed=2)  # groups=3, 3 -> 6 channels
W_TCONV, B_TCONV = _t(4, 3, 3, 3, seed=3), _t(6, seed=4)  # groups=2, 4 -> 6 channels
W_LIN, B_LIN = _t(5, 4, seed=5), _t(5, seed=6)
W_1D, B_1D = _t(6, 2, 3, seed=7), _t(6, seed=8)  # groups=2, 4 -> 6 channels
LN_W, LN_B = _t(8, seed=9), _t(8, seed=10)
BN = [_t(3, seed=11), _t(3, seed=12), _t(3, seed=13), _t(3, seed=14).abs() + 0.5]
GRU = _gru_params(2, 3, 4, 5)
LSTM = _gru_params(2, 4, 4, 5)

XNNPACK_CONV = "(Tensor, Tensor?, int[], int[], int[], int, Scalar?, Scalar?)"

CASES = [
    Case(
        "xnnpack.LinearOpContext",
        lambda: (
            ops.prepacked.linear_clamp_prepack(W_LIN, B_LIN, -1.0, 1.0),
            (W_LIN, B_LIN, -1.0, 1.0),
        ),
        "(Tensor, Tensor?, Scalar?, Scalar?)",
        "return torch.ops.prepacked.linear_clamp_run(x, self.ctx)",
        lambda: (_t(3, 4, seed=20),),
    ),
    Case(
        "xnnpack.Conv2dOpContext",
        lambda: (
            ops.prepacked.conv2d_clamp_prepack(W_CONV, B_CONV, [2, 1], [1, 0], [1, 2], 3, None, 6),
            (W_CONV, B_CONV, [2, 1], [1, 0], [1, 2], 3, None, 6),
        ),
        XNNPACK_CONV,
        "return torch.ops.prepacked.conv2d_clamp_run(x, self.ctx)",
        lambda: (_t(2, 3, 9, 8, seed=21),),
    ),
    Case(
        "xnnpack.TransposeConv2dOpContext",
        lambda: (
            ops.prepacked.conv2d_transpose_clamp_prepack(
                W_TCONV, None, [2, 2], [1, 1], [1, 0], [1, 1], 2, 0.0, None
            ),
            (W_TCONV, None, [2, 2], [1, 1], [1, 0], [1, 1], 2, 0.0, None),
        ),
        "(Tensor, Tensor?, int[], int[], int[], int[], int, Scalar?, Scalar?)",
        "return torch.ops.prepacked.conv2d_transpose_clamp_run(x, self.ctx)",
        lambda: (_t(1, 4, 5, 6, seed=22),),
    ),
    Case(
        "vulkan.Conv2dPackedContext (conv2d)",
        lambda: (
            ops.vulkan_prepack.create_conv2d_context(
                W_CONV, B_CONV, [1, 1], [1, 1], [1, 1], 3, 0.0, 6.0
            ),
            [W_CONV, B_CONV, [1, 1], [1, 1], [1, 1], False, False, [0], 3, 0.0, 6.0],
        ),
        "Any[]",
        "return torch.ops.vulkan_prepack.run_conv2d_context(x, self.ctx)",
        lambda: (_t(1, 3, 7, 7, seed=23),),
    ),
    Case(
        "vulkan.Conv2dPackedContext (tconv2d)",
        lambda: (
            ops.vulkan_prepack.create_tconv2d_context(
                W_TCONV, B_TCONV, [2, 2], [0, 1], [1, 1], [1, 1], 2, None, None
            ),
            [W_TCONV, B_TCONV, [2, 2], [0, 1], [1, 1], True, False, [1, 1], 2, None, None],
        ),
        "Any[]",
        "return torch.ops.vulkan_prepack.run_tconv2d_context(x, self.ctx)",
        lambda: (_t(1, 4, 5, 5, seed=24),),
    ),
    Case(
        "vulkan.Conv1dPackedContext",
        lambda: (
            ops.vulkan_prepack.create_conv1d_context(W_1D, B_1D, [2], [1], [1], 2),
            [W_1D, B_1D, [2], [1], [1], 2],
        ),
        "Any[]",
        "return torch.ops.vulkan_prepack.run_conv1d_context(x, self.ctx)",
        lambda: (_t(2, 4, 11, seed=25),),
    ),
    Case(
        "vulkan.LinearPackedContext",
        # upstream's rewrite passes the transposed weight: create_linear_context(W.t(), B)
        lambda: (ops.vulkan_prepack.create_linear_context(W_LIN.t(), B_LIN), [W_LIN.t(), B_LIN]),
        "Any[]",
        "return torch.ops.vulkan_prepack.run_linear_context(x, self.ctx)",
        lambda: (_t(2, 3, 4, seed=26),),
    ),
    Case(
        "vulkan.LayernormPackedContext",
        lambda: (ops.vulkan_prepack.create_layernorm_context(LN_W, LN_B, 1e-5), [LN_W, LN_B, 1e-5]),
        "Any[]",
        "return torch.ops.vulkan_prepack.run_layernorm_context(x, [8], self.ctx)",
        lambda: (_t(2, 3, 8, seed=27),),
    ),
    Case(
        "vulkan.BatchNormPackedContext",
        lambda: (
            ops.vulkan_prepack.create_batchnorm_context(*BN, False, 0.1, 1e-3, True),
            [*BN, 1e-3],
        ),
        "Any[]",
        "return torch.ops.vulkan_prepack.run_batchnorm_context(x, self.ctx)",
        lambda: (_t(2, 3, 4, 4, seed=28),),
    ),
    Case(
        "vulkan.GruPackedContext",
        # fxmobile pickles the 4-per-layer params_cpu it was given (see vulkan_contexts.h)
        lambda: (
            ops.vulkan_prepack.create_gru_context(GRU, True, 2, 0.0, False, False, True),
            [GRU, True, 2, 0.0, False, False, True],
        ),
        "Any[]",
        "return torch.ops.vulkan_prepack.run_gru_context(x, h, self.ctx)",
        lambda: (_t(3, 6, 4, seed=29), _t(2, 3, 5, seed=30)),
    ),
    Case(
        "vulkan.LstmPackedContext",
        lambda: (
            ops.vulkan_prepack.create_lstm_context(LSTM, True, 2, 0.0, False, False, True),
            [LSTM, True, 2, 0.0, False, False, True],
        ),
        "Any[]",
        "return torch.ops.vulkan_prepack.run_lstm_context(x, h, c, self.ctx)",
        lambda: (_t(3, 6, 4, seed=31), _t(2, 3, 5, seed=32), _t(2, 3, 5, seed=33)),
    ),
    Case(
        "metal.Conv2dOpContext",
        lambda: (
            ops.metal_prepack.conv2d_prepack(W_CONV, B_CONV, [1, 1], [0, 0], [1, 1], 3, 0, 6),
            (W_CONV, B_CONV, [1, 1], [0, 0], [1, 1], 3, 0, 6),
        ),
        XNNPACK_CONV,
        "return torch.ops.metal_prepack.conv2d_run(x, self.ctx)",
        lambda: (_t(1, 3, 6, 6, seed=34),),
    ),
    Case(
        "metal.LinearOpContext",
        lambda: (
            ops.metal_prepack.linear_prepack(W_LIN, None, None, 2.5),
            (W_LIN, None, None, 2.5),
        ),
        "(Tensor, Tensor?, Scalar?, Scalar?)",
        "return torch.ops.metal_prepack.linear_run(x, self.ctx)",
        lambda: (_t(4, seed=35),),
    ),
]


def _ids(case: Case) -> str:
    return case.cls


def _state(ctx: Any) -> Any:
    return ctx._get_method("__getstate__")()


def assert_same_state(got: Any, expected: Any, where: str = "state") -> None:
    """Same container types, lengths, element types and values (tensors compared exactly)."""
    assert type(got) is type(expected), (
        f"{where}: {type(got).__name__} != {type(expected).__name__}"
    )
    if isinstance(expected, list | tuple):
        assert len(got) == len(expected), f"{where}: {len(got)} elements != {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert_same_state(g, e, f"{where}[{i}]")
    elif isinstance(expected, torch.Tensor):
        assert torch.equal(got, expected), f"{where}: tensor differs"
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


_module_count = itertools.count()


def _module(ctx: Any, forward: str, n_inputs: int) -> torch.jit.ScriptModule:
    """A scripted module holding ``ctx`` as its attribute ``ctx`` (a new class each time)."""
    holder = type(f"ContextHolder{next(_module_count)}", (nn.Module,), {})
    module = torch.jit.script(holder())
    module._c._register_attribute("ctx", ctx._type(), ctx)
    names = ["x", "h", "c"][:n_inputs]
    signature = ", ".join(f"{n}: Tensor" for n in names)
    module.define(f"def forward(self, {signature}):\n    {forward}\n")
    return module


def _assert_identical(got: Any, expected: Any) -> None:
    got_t = got if isinstance(got, tuple) else (got,)
    exp_t = expected if isinstance(expected, tuple) else (expected,)
    assert len(got_t) == len(exp_t)
    for g, e in zip(got_t, exp_t, strict=True):
        assert torch.equal(g, e)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_state_has_upstreams_layout(case: Case) -> None:
    ctx, expected = case.make()
    schema = str(ctx._get_method("__getstate__").schema)
    returns = (
        f"({case.state_type} _0)" if case.state_type.startswith("(") else f"{case.state_type} _0"
    )
    assert schema.split(" -> ")[1] == returns, schema
    assert_same_state(_state(ctx), expected)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_torch_jit_save_load(case: Case) -> None:
    ctx, expected_state = case.make()
    inputs = case.inputs()
    module = _module(ctx, case.forward, len(inputs))
    before = module(*inputs)
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    _assert_identical(loaded(*inputs), before)
    assert_same_state(_state(loaded.ctx), expected_state)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_lite_interpreter_save_load(case: Case) -> None:
    ctx, _ = case.make()
    inputs = case.inputs()
    module = _module(ctx, case.forward, len(inputs))
    before = module(*inputs)
    run_op = case.forward.split("torch.ops.")[1].split("(")[0].replace(".", "::")
    assert run_op in torch.jit.export_opnames(module)
    loaded = _load_for_lite_interpreter(io.BytesIO(module._save_to_buffer_for_lite_interpreter()))
    _assert_identical(loaded(*inputs), before)


class _PrepackInForward(nn.Module):
    """conv2d + linear written with prepack/run calls, as a backend rewrite leaves them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_w = nn.Parameter(_t(4, 3, 3, 3, seed=40))
        self.conv_b = nn.Parameter(_t(4, seed=41))
        self.lin_w = nn.Parameter(_t(5, 4 * 4 * 4, seed=42))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = ops.prepacked.conv2d_clamp_prepack(
            self.conv_w, self.conv_b, [2, 2], [1, 1], [1, 1], 1, 0.0, None
        )
        y = ops.prepacked.conv2d_clamp_run(x, conv)
        lin = ops.vulkan_prepack.create_linear_context(self.lin_w.t(), None)
        return ops.vulkan_prepack.run_linear_context(y.flatten(1), lin)


def _eager_reference(m: _PrepackInForward, x: torch.Tensor) -> torch.Tensor:
    y = F.conv2d(x, m.conv_w, m.conv_b, 2, 1).clamp(min=0.0)
    return F.linear(y.flatten(1), m.lin_w)


def test_folded_prepack_survives_save_and_lite_interpreter() -> None:
    model = _PrepackInForward().eval()
    frozen = torch.jit.freeze(torch.jit.script(model))
    torch._C._jit_pass_constant_propagation(frozen.graph)
    kinds = {n.kind() for n in frozen.graph.nodes()}
    assert "prepacked::conv2d_clamp_prepack" not in kinds
    assert "vulkan_prepack::create_linear_context" not in kinds
    assert {"prepacked::conv2d_clamp_run", "vulkan_prepack::run_linear_context"} <= kinds

    x = _t(2, 3, 8, 8, seed=43)
    with torch.no_grad():
        expected = _eager_reference(model, x)
    torch.testing.assert_close(frozen(x), expected, rtol=1e-5, atol=1e-5)
    before = frozen(x)

    buffer = io.BytesIO()
    torch.jit.save(frozen, buffer)
    buffer.seek(0)
    assert torch.equal(torch.jit.load(buffer)(x), before)
    lite = _load_for_lite_interpreter(io.BytesIO(frozen._save_to_buffer_for_lite_interpreter()))
    assert torch.equal(lite(x), before)
    assert sorted(torch.jit.export_opnames(frozen)) == [
        "aten::flatten.using_ints",
        "prepacked::conv2d_clamp_run",
        "vulkan_prepack::run_linear_context",
    ]


def _upstream_rnn_state(params: list[torch.Tensor], gates: int, hidden: int) -> list[torch.Tensor]:
    """Upstream's Gru/LstmPackedContext.__getstate__ params.

    Per layer, per gate: (input weight, input bias, hidden weight, hidden bias).
    """
    out = []
    for layer in range(len(params) // 4):
        w_ih, w_hh, b_ih, b_hh = params[4 * layer : 4 * layer + 4]
        for g in range(gates):
            rows = slice(g * hidden, (g + 1) * hidden)
            out += [w_ih[rows], b_ih[rows], w_hh[rows], b_hh[rows]]
    return out


@pytest.mark.parametrize(
    ("run", "params", "gates", "reference"),
    [("gru", GRU, 3, torch.gru), ("lstm", LSTM, 4, torch.lstm)],
    ids=["gru", "lstm"],
)
def test_rnn_context_loads_upstreams_split_state(
    run: str, params: list[torch.Tensor], gates: int, reference: Any
) -> None:
    """Upstream pickles the per-gate split its own __setstate__ rejects; fxmobile loads it."""
    create = getattr(ops.vulkan_prepack, f"create_{run}_context")
    ctx = create(params, True, 2, 0.0, False, False, True)
    upstream_params = _upstream_rnn_state(params, gates, 5)
    assert len(upstream_params) == 4 * gates * 2
    split = [upstream_params, True, 2, 0.0, False, False, True]
    ctx._get_method("__setstate__")(split)
    assert_same_state(_state(ctx)[1:], split[1:])
    x, h = _t(3, 6, 4, seed=50), _t(2, 3, 5, seed=51)
    if run == "gru":
        got = ops.vulkan_prepack.run_gru_context(x, h, ctx)
        expected = reference(x, h, params, True, 2, 0.0, False, False, True)
    else:
        c = _t(2, 3, 5, seed=52)
        got = ops.vulkan_prepack.run_lstm_context(x, h, c, ctx)
        expected = reference(x, (h, c), params, True, 2, 0.0, False, False, True)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    # once loaded, the context pickles the 4-per-layer form every runtime accepts
    assert len(_state(ctx)[0]) == 4 * 2
