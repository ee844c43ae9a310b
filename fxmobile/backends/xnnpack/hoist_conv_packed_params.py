"""Hoist quantized convolutions' packed params to the root module, so the convs can go.

    %c = prim::GetAttr[name="conv"](%self); %p = prim::GetAttr[name="_packed_params"](%c)
      ->  %p = prim::GetAttr[name="_jit_pass_hoist_conv_packed_params.conv._packed_params.1"](%self)

The attribute name is upstream's (``hoist_conv_packed_params.cpp``): the access path, then a
counter from 1. Freezing again afterwards drops the now-empty quantized conv submodules, which
shrinks the saved file. Upstream does this on ``forward`` only; fxmobile does it on every
method it rewrites.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from fxmobile.infra import PassResult
from fxmobile.options import MobileOptimizerType
from fxmobile.script.freeze import freeze
from fxmobile.script.graph_utils import iter_nodes
from fxmobile.script.stage import ScriptContext, ScriptPass

PREFIX = "_jit_pass_hoist_conv_packed_params"
_QUANTIZED_CONVS = frozenset(
    f"__torch__.torch.{package}.{kind}"
    for package in ("ao.nn", "nn")
    for kind in (
        *(f"quantized.modules.conv.Conv{d}d" for d in (1, 2, 3)),
        *(f"intrinsic.quantized.modules.conv_relu.ConvReLU{d}d" for d in (1, 2, 3)),
    )
)
_MANGLE = re.compile(r"\.___torch_mangle_\d+")


def _module_type(value: torch._C.Value) -> str | None:
    kind = value.type()
    if not isinstance(kind, torch._C.ClassType):
        return None
    return _MANGLE.sub("", kind.qualified_name())


def _access_path(value: torch._C.Value, root: torch._C.Value) -> list[str] | None:
    """The attribute names from ``root`` to ``value`` along a chain of ``prim::GetAttr``."""
    path: list[str] = []
    while value is not root:
        node = value.node()
        if node.kind() != "prim::GetAttr":
            return None
        path.append(node.s("name"))
        value = node.inputsAt(0)
    return path[::-1]


class HoistConvPackedParams(ScriptPass):
    """Read quantized convs' ``_packed_params`` from root attributes; refreeze to drop the convs.

    Leaves every other attribute read as it is; declines nothing.
    """

    optimization = MobileOptimizerType.HOIST_CONV_PACKED_PARAMS
    summary = "<path>._packed_params of quantized convs -> root attribute; convs removed"

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        hoisted = hoist_packed_params(module, ctx.methods)
        if hoisted:
            module = freeze(module, ctx.preserved_attrs)  # drops the emptied conv modules
        return PassResult(module, hoisted)


def hoist_packed_params(module: torch.jit.ScriptModule, methods: Sequence[str]) -> int:
    """Point every quantized conv's ``_packed_params`` read at a new root attribute."""
    hoisted, counter = 0, 0
    for method in methods:
        graph = module._c._get_method(method).graph
        root = next(iter(graph.inputs()))
        for node in list(iter_nodes(graph)):
            if node.kind() != "prim::GetAttr" or "_packed_params" not in node.s("name"):
                continue
            owner = node.inputsAt(0)
            if _module_type(owner) not in _QUANTIZED_CONVS:
                continue
            path = _access_path(owner, root)
            if path is None:
                continue
            conv = module._c
            for part in path:
                conv = conv.getattr(part)
            base = f"{PREFIX}.{''.join(p + '.' for p in path)}_packed_params"
            counter += 1
            while module._c.hasattr(f"{base}.{counter}"):
                counter += 1
            name = f"{base}.{counter}"
            module._c._register_attribute(
                name, node.output().type(), conv.getattr("_packed_params")
            )
            node.replaceInput(0, root)
            node.s_("name", name)
            hoisted += 1
    return hoisted
