"""``graph_utils.reads_values``: which users of a tensor read its values, not only its
metadata (what lets fold_batchnorm fold a conv whose output a user only measures)."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx

from fxmobile.passes.graph_utils import reads_values, value_users


def input_of(fn: object) -> fx.Node:
    """The first placeholder of ``fn`` traced: the tensor whose users are asked about."""
    gm = fx.symbolic_trace(fn)  # type: ignore[arg-type]
    return next(n for n in gm.graph.nodes if n.op == "placeholder")


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.shape,
        lambda x: x.ndim,
        lambda x: x.dtype,
        lambda x: x.device,
        lambda x: x.size(),
        lambda x: x.size(1),
        lambda x: x.dim(),
        lambda x: x.ndimension(),
    ],
    ids=["shape", "ndim", "dtype", "device", "size", "size-dim", "dim", "ndimension"],
)
def test_metadata_alone_is_no_read_of_the_values(fn: object) -> None:
    x = input_of(fn)
    (user,) = x.users
    assert not reads_values(user, x)
    assert value_users(x) == []


@pytest.mark.parametrize(
    "fn",
    [lambda x: x + 1, lambda x: x.sum(), lambda x: x.T, lambda x: x.data, lambda x: x.mean()],
    ids=["add", "sum-method", "transpose-attribute", "data-attribute", "mean-method"],
)
def test_values_read_by_any_other_user(fn: object) -> None:
    x = input_of(fn)
    (user,) = x.users
    assert reads_values(user, x)


def test_the_metadata_of_another_tensor_is_no_exemption() -> None:
    """``y.size(x)`` is a user of ``x`` whose metadata call is on another tensor: ``x`` is read
    as its argument (the dim), as it is in ``x.size(x)`` and ``x.size(dim=x)``."""
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    size_by_x = graph.call_method("size", (y, x))
    size_by_keyword = graph.call_method("size", (x,), {"dim": x})
    size_of_x_by_x = graph.call_method("size", (x, x))
    graph.output((size_by_x, size_by_keyword, size_of_x_by_x))
    assert reads_values(size_by_x, x)
    assert reads_values(size_by_keyword, x)
    assert reads_values(size_of_x_by_x, x)  # x is also the dim: its value is read


def test_getattr_of_the_node_as_an_argument_elsewhere_reads_it() -> None:
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    attribute_named_by_x = graph.call_function(getattr, (y, x))
    indexed = graph.call_function(operator.getitem, (x, 0))
    graph.output((attribute_named_by_x, indexed))
    assert reads_values(attribute_named_by_x, x)
    assert reads_values(indexed, x)
    assert value_users(x) == [attribute_named_by_x, indexed]


def test_a_batchnorm_asserting_its_input_rank_does_not_read_the_conv_output() -> None:
    """timm's BatchNormAct2d: ``_assert(x.ndim == 4)`` before normalizing the conv output."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.ndim == 4, "expected 4-D")
        return x * 2

    x = input_of(forward)
    assert [u.target for u in value_users(x)] == [operator.mul]
