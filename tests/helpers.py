"""Shared test helpers: the one numerical-equivalence assertion, BN randomization, op counts."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def randomize_batchnorm(model: ModuleT, seed: int = 0) -> ModuleT:
    """Give every BatchNorm random running stats and affine parameters, in place; returns it.

    With default statistics (mean 0, var 1, weight 1, bias 0) a folding bug stays invisible.
    """
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            with torch.no_grad():
                if m.running_mean is not None and m.running_var is not None:
                    m.running_mean.copy_(torch.randn(n, generator=gen))
                    m.running_var.copy_(torch.rand(n, generator=gen) * 2 + 0.1)
                if m.affine:
                    m.weight.copy_(torch.randn(n, generator=gen))
                    m.bias.copy_(torch.randn(n, generator=gen))
    return model


def _to_double(x: Any) -> Any:
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def assert_equivalent(
    reference: Callable[..., Any],
    actual: Callable[..., Any],
    *inputs: Any,
    rel: float = 1e-5,
) -> None:
    """``actual(*inputs)`` matches ``reference`` run in float64, within ``rel`` of the output scale.

    The reference is deep-copied and run in float64 (when it is an ``nn.Module``) so rounding in
    float32 is told apart from a real bug: the message also shows how far eager float32 itself is
    from the float64 anchor.
    """
    with torch.no_grad():
        if isinstance(reference, nn.Module):
            ref64_model = copy.deepcopy(reference).double()
            expected = ref64_model(*pytree.tree_map(_to_double, inputs))
        else:
            expected = reference(*inputs)
        got = actual(*inputs)
        eager32 = reference(*inputs) if isinstance(reference, nn.Module) else expected
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    got_leaves, got_spec = pytree.tree_flatten(got)
    e32_leaves, _ = pytree.tree_flatten(eager32)
    assert exp_spec == got_spec, f"output structure differs: {got_spec} vs {exp_spec}"
    for i, (e, g, e32) in enumerate(zip(exp_leaves, got_leaves, e32_leaves, strict=True)):
        if not isinstance(e, torch.Tensor):
            assert e == g, f"output {i}: {g!r} != {e!r}"
            continue
        assert g.shape == e.shape, f"output {i}: shape {tuple(g.shape)} != {tuple(e.shape)}"
        if not e.is_floating_point():
            assert torch.equal(g, e), f"output {i}: integer outputs differ"
            continue
        e64 = e.double()
        scale = max(float(e64.abs().max()) if e64.numel() else 0.0, 1e-12)
        err = float((g.double() - e64).abs().max()) if e64.numel() else 0.0
        err32 = float((e32.double() - e64).abs().max()) if e64.numel() else 0.0
        assert err <= rel * scale, (
            f"output {i}: max abs error {err:.3g} exceeds {rel:g} x scale {scale:.3g} "
            f"(eager float32 is off by {err32:.3g})"
        )


def count_modules(gm: fx.GraphModule, kind: type[nn.Module]) -> int:
    """``call_module`` nodes whose module is exactly of type ``kind``."""
    return sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_module" and type(gm.get_submodule(str(n.target))) is kind
    )


def count_calls(gm: fx.GraphModule, target: Any) -> int:
    """``call_function`` nodes calling ``target`` or ``call_method`` nodes named ``target``."""
    return sum(
        1
        for n in gm.graph.nodes
        if (n.op == "call_function" and n.target is target)
        or (n.op == "call_method" and n.target == target)
    )


class LeafTracer(fx.Tracer):
    """A tracer that keeps modules of the given types as leaves (call_module nodes), as a
    user's ``leaf_modules`` would."""

    def __init__(self, *leaves: type[nn.Module]) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, self.leaves) or super().is_leaf_module(m, qualname)


def trace_keeping(model: nn.Module, *leaves: type[nn.Module]) -> fx.GraphModule:
    """``model`` traced with modules of ``leaves`` kept as calls (``model`` itself is the
    graph module's root: pass a copy when the test must keep it)."""
    return fx.GraphModule(model, LeafTracer(*leaves).trace(model))


def run_fx_passes(
    gm: fx.GraphModule, passes: list[Any], inputs: tuple[Any, ...] | None = None
) -> tuple[fx.GraphModule, list[Any]]:
    """``passes`` through the FX stage's manager (shapes from ``inputs``); the unit and records."""
    from fxmobile.infra import PassManager
    from fxmobile.passes.stage import FxContext, FxStage

    return PassManager(passes, FxStage(inputs), FxContext(inputs)).run(gm)


def captured(model: Any, **options: Any) -> Any:
    """``fxmobile.capture.capture`` behind the entry points' door: the options and the model
    are checked first (``make_options``, ``admit``), as ``optimize_fx`` checks them."""
    from fxmobile.capture import admit, capture
    from fxmobile.options import make_options

    checked = make_options(**options)
    admit(model, checked)
    return capture(model, checked)
