"""Writes through views, for the fuzzer: every view op of ``fxmobile.ops``'s domain, written
in place, on a copy (``y = x + 0``) or on the value itself (an input or an activation).

A ``VIEW_WRITE`` block takes a value, optionally copies it (the copies ``remove_identity``
removes: ``x + 0``, ``x * 1``, ``x - 0``, ``x / 1``; and ``x.clone()``), takes one or two views of
it and writes through the last one; its result is the tensor viewed, after the write (for a
copy, sometimes plus the value copied: ``y = x + 0; chunk(y)[0].add_(1); return y + x``). Views are
drawn from the value's static shape (``VIEWS``: name -> the view, and the arguments valid for a
shape), so every one is valid for any strides the value may have at run time: the only views
that depend on the layout (``flatten``, ``reshape`` to fewer dims, ``contiguous``: a copy of a
tensor they cannot view) return a copy silently, never fail.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

Shape = tuple[int, ...]
Args = tuple[Any, ...]


@dataclass(frozen=True)
class View:
    """One view op: how to take it, and the arguments that are valid for a given shape."""

    family: str  # the op, whatever the spelling (drawn first, so every op shows up as often)
    take: Callable[..., torch.Tensor]
    args: Callable[[Shape], list[Args]]
    layout_dependent: bool = False  # a view for some strides, a copy for others
    reads_strides: bool = False  # what it views depends on the memory layout itself


def _each_dim(shape: Shape) -> list[Args]:
    return [(d,) for d in range(len(shape))]


def _chunks(shape: Shape) -> list[Args]:
    return [(2, d, i) for d in range(len(shape)) for i in (0, -1)]


def _split_sizes(shape: Shape) -> list[Args]:
    return [(1, s - 1, d) for d, s in enumerate(shape) if s >= 2]


def _ends(shape: Shape) -> list[Args]:
    """(dim, index) for the first and last index of each dim."""
    return [(d, i) for d, s in enumerate(shape) for i in sorted({0, s - 1})]


def _narrows(shape: Shape) -> list[Args]:
    return [(d, 0, max(1, s // 2)) for d, s in enumerate(shape)] + [
        (d, s - 1, 1) for d, s in enumerate(shape) if s > 1
    ]


def _dim_pairs(shape: Shape) -> list[Args]:
    r = len(shape)
    return [(a, b) for a in range(r) for b in range(r) if a < b]


def _size_one_dims(shape: Shape) -> list[Args]:
    return [(d,) for d, s in enumerate(shape) if s == 1]


def _leading(shape: Shape) -> tuple[int, ...]:
    """An index that selects the first element of every dim but the last two."""
    return (0,) * (len(shape) - 2)


def _none(shape: Shape) -> list[Args]:
    return [()]


def _whole(shape: Shape) -> list[Args]:
    return [tuple(shape)]


def _from_rank(rank: int, args: Callable[[Shape], list[Args]]) -> Callable[[Shape], list[Args]]:
    return lambda shape: args(shape) if len(shape) >= rank else []


VIEWS: dict[str, View] = {
    "chunk": View("chunk", lambda y, n, d, i: y.chunk(n, d)[i], _chunks),
    "torch.chunk": View("chunk", lambda y, n, d, i: torch.chunk(y, n, d)[i], _chunks),
    "split": View("split", lambda y, d: y.split(1, d)[0], _each_dim),
    "split_sizes": View("split", lambda y, a, b, d: y.split([a, b], d)[1], _split_sizes),
    "tensor_split": View("split", lambda y, d: y.tensor_split(2, d)[0], _each_dim),
    "unbind": View("unbind", lambda y, d, i: y.unbind(d)[i], _ends),
    "torch.unbind": View("unbind", lambda y, d, i: torch.unbind(y, d)[i], _ends),
    "narrow": View("narrow", lambda y, d, start, length: y.narrow(d, start, length), _narrows),
    "select": View("select", lambda y, d, i: y.select(d, i), _ends),
    "torch.select": View("select", lambda y, d, i: torch.select(y, d, i), _ends),
    "index_int": View("index", lambda y, i: y[i], lambda s: [(0,), (-1,)]),
    "index_slice": View(
        "index", lambda y, a: y[:, a:], _from_rank(2, lambda s: [(min(1, s[1] - 1),)])
    ),
    "index_ellipsis": View("index", lambda y: y[..., 0], _none),
    "index_none": View("index", lambda y: y[:, None], _none),
    "index_step": View("index", lambda y: y[..., ::2], _none),
    "unflatten": View(
        "unflatten",
        lambda y, d, a, b: y.unflatten(d, (a, b)),
        lambda s: [(d, 1, n) for d, n in enumerate(s)] + [(d, n, 1) for d, n in enumerate(s)],
    ),
    "expand": View("expand", lambda y, *shape: y.expand(*shape), _whole),
    "expand_as": View("expand", lambda y: y.expand_as(y), _none),
    # a size-1 slice expanded to the full shape, then sliced back (writes must not overlap)
    "expand_slice": View(
        "expand", lambda y, *shape: y[:, :1].expand(*shape)[:, :1], _from_rank(2, _whole)
    ),
    "as_strided": View(
        "as_strided",
        lambda y, k: y.as_strided((k,), (1,)),
        lambda s: [(min(4, math.prod(s)),)],
        reads_strides=True,
    ),
    "t": View("t", lambda y, lead: y[lead].t(), _from_rank(2, lambda s: [(_leading(s),)])),
    "T": View("t", lambda y, lead: y[lead].T, _from_rank(2, lambda s: [(_leading(s),)])),
    "mT": View("t", lambda y: y.mT, _from_rank(2, _none)),
    "permute": View(
        "permute", lambda y, *dims: y.permute(*dims), lambda s: [tuple(reversed(range(len(s))))]
    ),
    "transpose": View("transpose", lambda y, a, b: y.transpose(a, b), _dim_pairs),
    "torch.transpose": View("transpose", lambda y, a, b: torch.transpose(y, a, b), _dim_pairs),
    "swapaxes": View("transpose", lambda y, a, b: y.swapaxes(a, b), _dim_pairs),
    "movedim": View("movedim", lambda y, a, b: y.movedim(a, b), _dim_pairs),
    "diagonal": View("diagonal", lambda y, a, b: y.diagonal(0, a, b), _dim_pairs),
    "torch.diagonal": View("diagonal", lambda y, a, b: torch.diagonal(y, 0, a, b), _dim_pairs),
    "view_same": View("view", lambda y, *shape: y.view(*shape), _whole),
    "view_as": View("view", lambda y: y.view_as(y), _none),
    "reshape_same": View("view", lambda y, *shape: y.reshape(*shape), _whole),
    "unsqueeze": View("unsqueeze", lambda y, d: y.unsqueeze(d), _each_dim),
    "torch.unsqueeze": View("unsqueeze", lambda y, d: torch.unsqueeze(y, d), _each_dim),
    "squeeze": View("squeeze", lambda y, d: y.squeeze(d), _size_one_dims),
    "squeeze_slice": View("squeeze", lambda y: y[:, :1].squeeze(1), _from_rank(2, _none)),
    "detach": View("alias", lambda y: y.detach(), _none),
    "data": View("alias", lambda y: y.data, _none),
    "type_as": View("alias", lambda y: y.type_as(y), _none),
    "unfold": View("unfold", lambda y, d: y.unfold(d, 1, 1), _each_dim),
    "flatten": View("reshape", lambda y: y.flatten(1), _from_rank(2, _none), layout_dependent=True),
    "reshape_flat": View(
        "reshape",
        lambda y, n: y.reshape(n, -1),
        _from_rank(2, lambda s: [(s[0],)]),
        layout_dependent=True,
    ),
    "contiguous": View("contiguous", lambda y: y.contiguous(), _none, layout_dependent=True),
}


def view_shape(shape: Shape, name: str, args: Args) -> Shape:
    """The shape of view ``name`` with ``args`` of a tensor of ``shape`` (run on meta)."""
    return tuple(VIEWS[name].take(torch.empty(shape, device="meta"), *args).shape)


def _setitem(v: torch.Tensor, c: float) -> torch.Tensor:
    v[...] = c
    return v


# how the view is written: name -> the write, given the view and a constant
WRITES: dict[str, Callable[[torch.Tensor, float], Any]] = {
    "add_": lambda v, c: v.add_(c),
    "mul_": lambda v, c: v.mul_(c),
    "relu_": lambda v, c: v.relu_(),
    "torch.relu_": lambda v, c: torch.relu_(v),
    "clamp_": lambda v, c: v.clamp_(-abs(c), abs(c)),
    "F.hardtanh(inplace)": lambda v, c: F.hardtanh(v, -abs(c), abs(c), inplace=True),
    "setitem": _setitem,
    "copy_": lambda v, c: v.copy_(v * 0.5 + c),
    "fill_": lambda v, c: v.fill_(c),
    "zero_": lambda v, c: v.zero_(),
}
# the copies taken first: name -> the copy
COPIES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "add0": lambda x: x + 0,
    "mul1": lambda x: x * 1,
    "sub0": lambda x: operator.sub(x, 0),
    "div1": lambda x: x / 1,
    "clone": lambda x: x.clone(),
}


def run_view_write(x: torch.Tensor, options: dict[str, Any]) -> torch.Tensor:
    """The block: copy (or not), view, write; the tensor viewed, after the write (plus the
    value copied, with ``read_source``: a write that reached it instead of the copy shows)."""
    base = COPIES[options["copy"]](x) if options["copy"] else x
    view = base
    for name, args in options["views"]:
        view = VIEWS[name].take(view, *args)
    WRITES[options["write"]](view, options["value"])
    return base + x if options.get("read_source") else base
