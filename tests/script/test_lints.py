"""generate_mobile_module_lints: every code, with its message, written out by hand.

Upstream's codes (BUNDLED_INPUT, REQUIRES_GRAD, DROPOUT, BATCHNORM) and fxmobile's
(NOT_PREPACKED, RUNTIME_PREPACK, INPUT_NOT_CHANNELS_LAST, NO_MOBILE_KERNEL), each raised by the
module that has the problem and absent from the one that does not.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch.utils.bundled_inputs
import torchvision  # noqa: F401  (registers torchvision::nms)
from torch import nn

import fxmobile
from fxmobile.errors import InvalidArgumentError
from fxmobile.script.freeze import freeze
from fxmobile.script.lints import generate_mobile_module_lints
from fxmobile.script.quiet_script import quietly_script

pytestmark = pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")

NO_BUNDLED_INPUT = {
    "name": "BUNDLED_INPUT",
    "message": "No bundled input for forward, please add bundled inputs before saving the "
    "module using torch.utils.bundled_inputs.augment_model_with_bundled_inputs.",
}


def requires_grad(param: str) -> dict[str, str]:
    return {
        "name": "REQUIRES_GRAD",
        "message": f"Param {param} requires grad, please set torch.no_grad() to reduce memory "
        "usage and improve computation speed during inference phase.",
    }


def leftover(code: str, op: str, verb: str, word: str) -> dict[str, str]:
    return {
        "name": code,
        "message": f"Operator {op} exists, remember to call eval() before saving the module and "
        f"optimize it (fxmobile.optimize_for_mobile) to {verb} the {word} operator.",
    }


def not_prepacked(op: str) -> dict[str, str]:
    return {
        "name": "NOT_PREPACKED",
        "message": f"Operator {op} runs unpacked: optimize the module for a backend (and check "
        "its report for why this one was skipped) to prepack its weights.",
    }


NOT_CHANNELS_LAST = {
    "name": "INPUT_NOT_CHANNELS_LAST",
    "message": "The model convolves its input but never makes it channels-last; pass "
    "channels_last=True (or feed channels-last tensors) for faster mobile kernels.",
}


class Trained(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.bn(self.conv(x)))


def test_a_module_scripted_as_trained_gets_upstreams_lints_and_ours() -> None:
    lints = generate_mobile_module_lints(torch.jit.script(Trained()))
    # in export_opnames' order: aten::batch_norm, aten::conv2d, aten::dropout
    assert lints == [
        NO_BUNDLED_INPUT,
        requires_grad("conv.weight"),
        requires_grad("conv.bias"),
        requires_grad("bn.weight"),
        requires_grad("bn.bias"),
        leftover("BATCHNORM", "aten::batch_norm", "fold", "batch_norm"),
        not_prepacked("aten::conv2d"),
        leftover("DROPOUT", "aten::dropout", "drop", "dropout"),
        NOT_CHANNELS_LAST,
    ]


def test_parameters_without_grad_are_not_linted() -> None:
    model = Trained()
    model.requires_grad_(False)
    names = [lint["name"] for lint in generate_mobile_module_lints(torch.jit.script(model))]
    assert "REQUIRES_GRAD" not in names and "BATCHNORM" in names


def test_an_optimized_module_with_bundled_inputs_in_channels_last_has_none() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout(), nn.ReLU()).eval()
    optimized = fxmobile.optimize(model, example_inputs=torch.randn(1, 3, 8, 8)).module
    torch.utils.bundled_inputs.augment_model_with_bundled_inputs(
        optimized, [(torch.zeros(1, 3, 8, 8),)]
    )
    assert generate_mobile_module_lints(optimized) == []


class Packed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 4), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w * x.mean())


def test_a_prepack_left_in_the_graph_repacks_on_every_call() -> None:
    optimized = fxmobile.optimize(Packed().eval(), example_inputs=torch.randn(3, 4)).module
    lints = [
        lint for lint in generate_mobile_module_lints(optimized) if lint["name"] != "BUNDLED_INPUT"
    ]
    assert lints == [
        {
            "name": "RUNTIME_PREPACK",
            "message": "Operator prepacked::linear_clamp_prepack runs on every call: its weights "
            "are not constant, so they are repacked each time instead of once at optimization "
            "time.",
        }
    ]


def test_a_vulkan_create_call_left_in_the_graph_repacks_too() -> None:
    blocklist = {fxmobile.MobileOptimizerType.VULKAN_AUTOMATIC_GPU_TRANSFER}
    optimized = fxmobile.optimize_for_mobile(Packed().eval(), blocklist, backend="vulkan")
    names = {lint["name"]: lint["message"] for lint in generate_mobile_module_lints(optimized)}
    assert names["RUNTIME_PREPACK"].startswith(
        "Operator vulkan_prepack::create_linear_context runs on every call"
    )


def test_an_unprepacked_linear_is_linted() -> None:
    module = freeze(quietly_script(nn.Sequential(nn.Linear(3, 3)).eval()), [])
    lints = generate_mobile_module_lints(module)
    assert not_prepacked("aten::linear") in lints
    assert NOT_CHANNELS_LAST not in lints  # no convolution


class Custom(nn.Module):
    # torchvision's operators are registered by its import and live as long as the process. A
    # torch.library.Library defined and deleted in a test would leave its operator's id in
    # TorchScript's builtin table, and a later object given that id (a Conv2d's padding list)
    # fails to script as "builtin cannot be used as a value".
    def forward(self, boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return torch.ops.torchvision.nms(boxes, torch.relu(scores), 0.5)


def test_an_operator_no_mobile_runtime_ships_is_linted() -> None:
    lints = generate_mobile_module_lints(torch.jit.script(Custom()))
    assert lints == [
        NO_BUNDLED_INPUT,
        {
            "name": "NO_MOBILE_KERNEL",
            "message": "Operator torchvision::nms is from a namespace PyTorch's mobile "
            "runtimes do not ship; register a kernel for it in the app or rewrite it.",
        },
    ]


class Layout(nn.Module):
    """A convolution behind one layout change, given as ``contiguous`` or ``to``."""

    def __init__(self, change: str, padding: str | int = 0) -> None:
        super().__init__()
        self.change = change
        self.conv = nn.Conv2d(3, 3, 3, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.change == "contiguous_channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        elif self.change == "to_channels_last":
            x = x.to(memory_format=torch.channels_last)
        elif self.change == "contiguous":
            x = x.contiguous()
        return self.conv(x)


def _lints_of(model: nn.Module) -> list[dict[str, str]]:
    return generate_mobile_module_lints(freeze(quietly_script(model.eval()), []))


def test_a_channels_last_input_clears_the_layout_lint() -> None:
    """``contiguous`` and ``to`` both make it: the memory format is the last of ``to``'s eight
    arguments, as of ``contiguous``'s two."""
    for change in ("contiguous_channels_last", "to_channels_last"):
        lints = _lints_of(Layout(change))
        assert NOT_CHANNELS_LAST not in lints, change
        assert not_prepacked("aten::conv2d") in lints, change


def test_a_plain_contiguous_keeps_the_layout_lint() -> None:
    """``contiguous()`` names a memory format too, a constant one, but not channels-last."""
    assert NOT_CHANNELS_LAST in _lints_of(Layout("contiguous"))


def test_an_operator_overload_is_linted_by_its_operator() -> None:
    """``padding="same"`` scripts to the ``aten::conv2d.padding`` overload: still a plain
    convolution, named with its overload."""
    lints = _lints_of(Layout("none", padding="same"))
    assert not_prepacked("aten::conv2d.padding") in lints


def test_anything_but_a_script_module_is_refused() -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"Got <class 'torch\.nn\.modules\.linear\.Linear'>"
    ):
        generate_mobile_module_lints(nn.Linear(2, 2))  # type: ignore[arg-type]
