"""Freezing: inline submodules and turn parameters into constants, keeping what must stay.

``forward``, the preserved methods and, when the module has bundled inputs
(``torch.utils.bundled_inputs``), the methods and attributes that serve them are kept, exactly
as upstream's ``optimize_for_mobile`` keeps them. Freezing calls ``torch._C._freeze_module``
directly rather than ``torch.jit.freeze``: the latter also runs frozen-graph optimizations, one
of which turns ``aten::linear`` into a matmul with a transposed weight, which would hide the
linears the backends want to prepack.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fxmobile.infra import PassResult
from fxmobile.script.stage import ScriptContext, ScriptPass


def bundled_inputs_attributes(
    module: torch.jit.ScriptModule, preserved: Sequence[str]
) -> list[str]:
    """What upstream keeps for bundled inputs (``_get_bundled_inputs_preserved_attributes``)."""
    attrs: list[str] = []
    if hasattr(module, "get_all_bundled_inputs"):
        attrs += ["get_all_bundled_inputs", "get_num_bundled_inputs"]
    if hasattr(module, "get_bundled_inputs_functions_and_info"):
        attrs.append("get_bundled_inputs_functions_and_info")
        for function_name in module.get_bundled_inputs_functions_and_info():
            if function_name not in preserved:
                attrs.append(function_name)
            attrs.append(f"get_all_bundled_inputs_for_{function_name}")
            attrs.append(f"_bundled_inputs_deflated_{function_name}")
    return attrs


def freeze(module: torch.jit.ScriptModule, preserved: Sequence[str]) -> torch.jit.ScriptModule:
    """``module`` frozen with ``preserved`` kept, without ``torch.jit.freeze``'s optimizations."""
    frozen = torch._C._freeze_module(module._c, list(preserved), True, False)
    return torch.jit._recursive.wrap_cpp_module(frozen)


class Freeze(ScriptPass):
    """Freeze the module (not blocklistable: every later rewrite needs constants)."""

    optimization = None
    summary = "submodule calls, parameters -> inlined graph, constants"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        before = sum(1 for _ in module.modules())
        frozen = freeze(module, ctx.preserved_attrs)
        # Rewrites: submodules inlined away.
        return PassResult(frozen, before - sum(1 for _ in frozen.modules()))
