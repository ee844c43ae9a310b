"""Convolutions in the forms the backends prepack: ``aten::conv{1,2,3}d`` / ``conv_transpose*``
with integer padding.

    _convolution(x, W, b, stride, padding, dilation, transposed=False, ...)
                                         ->  conv{N}d(x, W, b, stride, padding, dilation, groups)
    _convolution(..., transposed=True, output_padding, groups, ...)
                                         ->  conv_transpose{N}d(x, W, b, stride, padding,
                                                                output_padding, groups, dilation)
    _convolution_mode(x, W, b, stride, "same", dilation, groups)   (and conv{N}d with a string)
                                         ->  conv{N}d(x, W, b, stride, [p...], dilation, groups)

``torch.jit.trace`` records ``aten::_convolution`` (and ``_convolution_mode`` for string padding)
where scripting records ``conv2d``; N comes from the constant weight's rank. String padding:
``"valid"`` is zeros; ``"same"`` (stride 1, which torch requires for it) pads ``dilation * (k -
1)`` in total per dimension, evenly when that is even, so ``p = dilation * (k - 1) / 2``. When it
is odd torch pads one more at the end, which integer padding cannot say: that conv stays as it
is, and the report says so.
"""

from __future__ import annotations

from typing import Any

import torch

from fxmobile.infra import PassResult, Skips
from fxmobile.script.graph_utils import constant, iter_nodes, method_graphs
from fxmobile.script.stage import ScriptContext, ScriptPass

_CONVOLUTION = ("aten::_convolution", "aten::_convolution_mode")
_STRING_PADDED = ("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::_convolution_mode")


def integer_padding(padding: str, weight: torch.Tensor, dilation: list[int]) -> list[int] | str:
    """The integer padding a string padding means for this weight, or why there is none."""
    kernel = list(weight.shape[2:])
    if padding == "valid":
        return [0] * len(kernel)
    if padding != "same":
        return f"unknown padding {padding!r}"
    dilation = dilation * len(kernel) if len(dilation) == 1 else dilation
    totals = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
    if any(total % 2 for total in totals):
        return f"'same' padding of kernel {kernel} is asymmetric (no integer padding says it)"
    return [total // 2 for total in totals]


def canonical(node: torch._C.Node) -> tuple[str, list[Any]] | str | None:
    """The canonical op and its argument values (``torch._C.Value`` or new constants) for
    ``node``, why it has none, or None when ``node`` is already canonical or no convolution."""
    kind = node.kind()
    if kind not in (*_CONVOLUTION, *_STRING_PADDED):
        return None
    inputs = list(node.inputs())
    weight = constant(inputs[1])
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (3, 4, 5):
        return f"{kind} weight is not a constant 3-5-D tensor"
    dims = weight.dim() - 2
    padding: Any = inputs[4]
    if kind == "aten::_convolution_mode" or not isinstance(padding.type(), torch._C.ListType):
        text, dilation = constant(padding), constant(inputs[5])
        if not isinstance(text, str) or not isinstance(dilation, list):
            return f"{kind} padding or dilation is not a constant"
        padding = integer_padding(text, weight, dilation)
        if isinstance(padding, str):
            return padding
        return f"aten::conv{dims}d", [*inputs[:4], padding, inputs[5], inputs[6]]
    if kind != "aten::_convolution":
        return None
    transposed = constant(inputs[6])
    if not isinstance(transposed, bool):
        return "aten::_convolution transposed flag is not a constant"
    x, w, b, stride, pad, dilation, _, output_padding, groups = inputs[:9]
    if transposed:
        args = [x, w, b, stride, pad, output_padding, groups, dilation]
        return f"aten::conv_transpose{dims}d", args
    return f"aten::conv{dims}d", [x, w, b, stride, pad, dilation, groups]


class CanonicalizeConvolutions(ScriptPass):
    """Rewrite traced and string-padded convolutions as ``conv{N}d`` / ``conv_transpose{N}d``.

    Leaves, reported, a conv whose weight, padding or dilation is not a constant, and a ``"same"``
    conv whose total padding is odd (torch pads one more at the end).
    """

    summary = (
        "aten::_convolution / _convolution_mode / string padding -> conv{N}d or "
        "conv_transpose{N}d with integer padding"
    )

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        """Rewrite every convolution that has a canonical form, in every method."""
        rewrites, skips = 0, Skips()
        for graph in method_graphs(module, ctx.methods):
            g: Any = graph  # torch's stubs omit Graph.insert's list form and insertConstant
            for node in list(iter_nodes(graph)):
                found = canonical(node)
                if found is None:
                    continue
                if isinstance(found, str):
                    skips.add(found)
                    continue
                kind, args = found
                with graph.insert_point_guard(node):
                    values = [
                        a if isinstance(a, torch._C.Value) else g.insertConstant(a) for a in args
                    ]
                    out = g.insert(kind, values)
                out.setType(node.output().type())
                node.output().replaceAllUsesWith(out)
                node.destroy()
                rewrites += 1
        return PassResult(module, rewrites, dict(skips))
