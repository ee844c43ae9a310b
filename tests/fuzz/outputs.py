"""How a fuzzed model returns its outputs: a tensor, a tuple, a list, a dict, a NamedTuple or a
dataclass; and how the oracle reads them back.

(No ``from __future__ import annotations`` here: TorchScript reads these classes' annotations.)
"""

import dataclasses
from typing import Any, NamedTuple

import torch
from torch.utils import _pytree as pytree

OUTPUT_TYPES = ("plain", "tuple", "list", "dict", "namedtuple", "dataclass")
NAMES = ("out", "aux")


class Single(NamedTuple):
    out: torch.Tensor


class Pair(NamedTuple):
    out: torch.Tensor
    aux: torch.Tensor


@dataclasses.dataclass
class SingleData:
    out: torch.Tensor


@dataclasses.dataclass
class PairData:
    out: torch.Tensor
    aux: torch.Tensor


def pack(output_type: str, outputs: tuple[torch.Tensor, ...]) -> Any:
    """``outputs`` (one or two tensors) in the container ``output_type`` names."""
    if output_type == "plain":
        return outputs[0] if len(outputs) == 1 else outputs
    if output_type == "tuple":
        return outputs
    if output_type == "list":
        return list(outputs)
    if output_type == "dict":
        return dict(zip(NAMES, outputs, strict=False))
    if output_type == "namedtuple":
        return Single(*outputs) if len(outputs) == 1 else Pair(*outputs)
    return SingleData(*outputs) if len(outputs) == 1 else PairData(*outputs)


def flatten(outputs: Any) -> list[torch.Tensor]:
    """The tensors in ``outputs``, in order (dataclasses read field by field)."""
    if dataclasses.is_dataclass(outputs) and not isinstance(outputs, type):
        fields = [getattr(outputs, f.name) for f in dataclasses.fields(outputs)]
        return [t for field in fields for t in flatten(field)]
    return [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]


def structure(outputs: Any, exact_types: bool) -> Any:
    """What the caller sees of the container: its kind, fields or keys, and (``exact_types``)
    its class. TorchScript returns its own class for a NamedTuple, with the same fields."""
    if isinstance(outputs, torch.Tensor):
        return "tensor"
    cls = type(outputs).__qualname__ if exact_types else None
    if dataclasses.is_dataclass(outputs):
        fields = tuple(f.name for f in dataclasses.fields(outputs))
        return ("dataclass", type(outputs).__qualname__, fields)
    if isinstance(outputs, tuple) and hasattr(outputs, "_fields"):
        return ("namedtuple", cls, tuple(outputs._fields))
    if isinstance(outputs, dict):
        return ("dict", tuple(outputs))
    return (type(outputs).__name__, len(outputs))
