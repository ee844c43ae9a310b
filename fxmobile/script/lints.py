"""Lints for a scripted module about to ship: upstream's four codes and what else bites.

``generate_mobile_module_lints`` returns upstream's shape, a list of ``{"name", "message"}``
dicts, with upstream's codes (``BUNDLED_INPUT``, ``REQUIRES_GRAD``, ``DROPOUT``, ``BATCHNORM``)
and messages to the same effect, plus:

- ``NOT_PREPACKED``: a convolution or linear still runs as a plain ATen op;
- ``RUNTIME_PREPACK``: a prepack op is still in the graph, so weights repack on every call;
- ``INPUT_NOT_CHANNELS_LAST``: the model convolves 4-D inputs but never makes them channels-last,
  the layout mobile convolution kernels run fastest in;
- ``NO_MOBILE_KERNEL``: an operator from a namespace the lite interpreter does not ship.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from fxmobile.errors import InvalidArgumentError
from fxmobile.script.graph_utils import iter_nodes


class LintCode(enum.Enum):
    """The codes of ``generate_mobile_module_lints``: upstream's four, then fxmobile's own."""

    BUNDLED_INPUT = 1
    REQUIRES_GRAD = 2
    DROPOUT = 3
    BATCHNORM = 4
    NOT_PREPACKED = 5
    RUNTIME_PREPACK = 6
    INPUT_NOT_CHANNELS_LAST = 7
    NO_MOBILE_KERNEL = 8


# operator namespaces with kernels in PyTorch's mobile runtimes
MOBILE_NAMESPACES = frozenset(
    {"aten", "prim", "prepacked", "quantized", "_quantized", "vulkan_prepack", "metal_prepack"}
)
_PLAIN_HEAVY_OPS = frozenset(
    {"aten::conv1d", "aten::conv2d", "aten::conv_transpose2d", "aten::linear", "aten::_convolution"}
)
_CONV_KINDS = frozenset(
    {
        "aten::conv2d",
        "aten::_convolution",
        "prepacked::conv2d_clamp_run",
        "prepacked::conv2d_transpose_clamp_run",
        "vulkan_prepack::run_conv2d_context",
        "metal_prepack::conv2d_run",
    }
)
_CHANNELS_LAST = 2
_BUNDLED_FORWARD = (
    "_generate_bundled_inputs_for_forward",
    "get_all_bundled_inputs_for_forward",
    "get_all_bundled_inputs",
)  # torch.channels_last as a TorchScript int constant


def _lint(code: LintCode, message: str) -> dict[str, str]:
    return {"name": code.name, "message": message}


def _makes_channels_last(graph: torch._C.Graph) -> bool:
    """A ``contiguous`` or ``to`` whose memory_format (its last argument) is channels_last."""
    for node in iter_nodes(graph):
        if node.kind() not in ("aten::contiguous", "aten::to"):
            continue
        last = list(node.inputs())[-1]
        if last.node().kind() == "prim::Constant" and last.toIValue() == _CHANNELS_LAST:
            return True
    return False


def generate_mobile_module_lints(script_module: torch.jit.ScriptModule) -> list[dict[str, Any]]:
    """Everything worth knowing before shipping ``script_module`` to a phone."""
    if not isinstance(script_module, torch.jit.ScriptModule):
        raise InvalidArgumentError(
            f"Got {type(script_module)}, but ScriptModule is expected. Lint the result of "
            f"fxmobile.optimize_for_mobile, or torch.jit.script the module first."
        )
    lints = []
    # Upstream looks for _generate_bundled_inputs_for_forward only, which freezing drops: an
    # optimized module with bundled inputs would be told it has none.
    if not any(hasattr(script_module, name) for name in _BUNDLED_FORWARD):
        lints.append(
            _lint(
                LintCode.BUNDLED_INPUT,
                "No bundled input for forward, please add bundled inputs before saving the module "
                "using torch.utils.bundled_inputs.augment_model_with_bundled_inputs.",
            )
        )
    for name, param in script_module.named_parameters():
        if param.requires_grad:
            lints.append(
                _lint(
                    LintCode.REQUIRES_GRAD,
                    f"Param {name} requires grad, please set torch.no_grad() to reduce memory "
                    "usage and improve computation speed during inference phase.",
                )
            )
    op_names = torch.jit.export_opnames(script_module)
    for op in op_names:
        base = op.split(".")[0]
        if "dropout" in op:
            lints.append(
                _lint(
                    LintCode.DROPOUT,
                    f"Operator {op} exists, remember to call eval() before saving the module and "
                    "optimize it (fxmobile.optimize_for_mobile) to drop the dropout operator.",
                )
            )
        if "batch_norm" in op:
            lints.append(
                _lint(
                    LintCode.BATCHNORM,
                    f"Operator {op} exists, remember to call eval() before saving the module and "
                    "optimize it (fxmobile.optimize_for_mobile) to fold the batch_norm operator.",
                )
            )
        if base in _PLAIN_HEAVY_OPS:
            lints.append(
                _lint(
                    LintCode.NOT_PREPACKED,
                    f"Operator {op} runs unpacked: optimize the module for a backend (and check "
                    "its report for why this one was skipped) to prepack its weights.",
                )
            )
        if base.endswith("_prepack") or base.startswith("vulkan_prepack::create_"):
            lints.append(
                _lint(
                    LintCode.RUNTIME_PREPACK,
                    f"Operator {op} runs on every call: its weights are not constant, so they "
                    "are repacked each time instead of once at optimization time.",
                )
            )
        if base.split("::")[0] not in MOBILE_NAMESPACES:
            lints.append(
                _lint(
                    LintCode.NO_MOBILE_KERNEL,
                    f"Operator {op} is from a namespace PyTorch's mobile runtimes do not ship; "
                    "register a kernel for it in the app or rewrite it.",
                )
            )
    if script_module._c._has_method("forward"):
        graph = script_module._c._get_method("forward").inlined_graph
        convolves = any(n.kind() in _CONV_KINDS for n in iter_nodes(graph))
        if convolves and not _makes_channels_last(graph):
            lints.append(
                _lint(
                    LintCode.INPUT_NOT_CHANNELS_LAST,
                    "The model convolves its input but never makes it channels-last; pass "
                    "channels_last=True (or feed channels-last tensors) for faster mobile kernels.",
                )
            )
    return lints
