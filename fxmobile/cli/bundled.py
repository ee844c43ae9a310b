"""The example inputs' shapes, bundled into the lite-interpreter file ``fxmobile optimize`` writes.

``torch.utils.bundled_inputs`` gives a TorchScript module methods that return inputs for
``forward`` (``get_all_bundled_inputs``); apps' benchmark tools and ``fxmobile check`` run the
file on them, and upstream's ``BUNDLED_INPUT`` lint asks for them. What is bundled is a spec,
not the tensors: each float input as ``bundle_randn`` (a one-element zero expanded to the shape,
drawn with ``torch.randn_like`` when the method runs), each other input as zeros of its shape
and dtype (valid indices for an embedding, where random integers might not be). A file gains a
few hundred bytes whatever the input size.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.bundled_inputs import augment_model_with_bundled_inputs, bundle_randn

from fxmobile.errors import InvalidValueError


def has_bundled_inputs(module: torch.jit.ScriptModule) -> bool:
    """Whether ``module`` already carries bundled inputs (a TorchScript SPEC can)."""
    return hasattr(module, "get_all_bundled_inputs")


def bundle_example_shapes(module: torch.jit.ScriptModule, inputs: tuple[Any, ...]) -> list[str]:
    """Bundle one input set for ``forward``: the shape and dtype of each of ``inputs``; what was
    bundled, one description per input (``1x3x224x224 float32, torch.randn_like``)."""
    specs = []
    described = []
    for x in inputs:
        if not isinstance(x, torch.Tensor):
            raise InvalidValueError(
                f"cannot bundle a {type(x).__name__} example input; pass --no-bundled-inputs"
            )
        shape = "x".join(map(str, x.shape)) or "scalar"
        dtype = str(x.dtype).removeprefix("torch.")
        if x.is_floating_point():
            specs.append(bundle_randn(*x.shape, dtype=x.dtype))
            described.append(f"{shape} {dtype}, torch.randn_like")
        else:
            specs.append(torch.zeros(1, dtype=x.dtype).expand(x.shape))
            described.append(f"{shape} {dtype}, zeros")
    augment_model_with_bundled_inputs(module, [tuple(specs)])
    return described
