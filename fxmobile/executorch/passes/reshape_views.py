"""Views that only change the shape, as the one reshape XNNPACK takes.

    squeeze(x, dims)       -> reshape(x, out.shape)
    unsqueeze(x, d)        -> reshape(x, out.shape)      (d before the last dim)
    flatten(x, a, b)       -> reshape(x, out.shape)
    unflatten(x, d, sizes) -> reshape(x, out.shape)
    expand(x, sizes)       -> reshape(x, out.shape)      (sizes that add no element: a no-op)
    repeat(x, [1, ...])    -> reshape(x, out.shape)      (likewise)
    alias(x)               -> x                          (a reshape when it is an output)
    cat([x], d)            -> x                          (likewise)
    reshape(x, x.shape)    -> x                          (likewise)

Each keeps the elements in order and changes only the sizes, so a reshape to the output's
static shape computes the same tensor (the graph is functional: nobody writes through the view).
ExecuTorch's XNNPACK partitioner takes ``view_copy``, but has no config for ``squeeze_copy``
(timm's attention unbinds q, k and v, which leaves three squeezes per block) and takes
``unsqueeze_copy`` only on the trailing dim; each one it declines cuts the delegate in two. An
``alias`` is what the export leaves of a slice over a whole dim (timm's Swin crops its windows
back with ``x[:, :H, :W, :]`` in every block, twelve cuts in Swin-T); the partitioner has no
config for ``alias_copy`` either, and the tensor it names is its input's, so its users take the
input itself (a graph output gets a reshape: an output is never its input's tensor). So do the
users of a ``cat`` of one tensor, a copy of it (torchvision's DenseNet starts each dense block
with one; the partitioner takes a ``cat`` of two tensors or more). And so do the users of a
reshape to its input's own shape, which is its input's tensor: the passes before this one write
the general form (``decompose_layer_norm`` reshapes to rows and back, and its weight to [M]),
and where it changes nothing it is a node for ExecuTorch's lowering to trace through every one
of its passes (92 of the 460 ops of torchvision's ConvNeXt-T).

A ``repeat`` by ones copies its input (XCiT repeats its positional encoding by the batch size,
1 in a program for one image); the partitioner has no config for ``repeat``.

Left alone, with the reason: a ``repeat`` that tiles (XNNPACK has no tiling op), and an output
whose shape is unknown or symbolic.
"""

from __future__ import annotations

from typing import ClassVar

from torch import fx

from fxmobile.executorch.passes.aten import aten, call, integer, integers, numel, shape
from fxmobile.infra import PassResult, Skips
from fxmobile.options import MobileOptimizerType
from fxmobile.passes.graph_utils import replace_node
from fxmobile.passes.stage import FxContext, FxPass

SHAPE_ONLY = frozenset(
    {
        aten.squeeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.unsqueeze.default,
        aten.flatten.using_ints,
        aten.unflatten.int,
        aten.alias.default,
    }
)


def _same_tensor(node: fx.Node) -> fx.Node | None:
    """The input ``node`` is as it is: that of an alias, of a cat of one tensor or of a reshape
    to its own shape; None for any other node."""
    if node.op != "call_function":
        return None
    source = node.args[0] if node.args else None
    if node.target is aten.cat.default:
        if isinstance(source, list | tuple) and len(source) == 1:
            return source[0] if isinstance(source[0], fx.Node) else None
        return None
    if not isinstance(source, fx.Node):
        return None
    if node.target is aten.alias.default:
        return source
    if node.target is aten.reshape.default:
        sizes = shape(node)
        return source if sizes is not None and sizes == shape(source) else None
    return None


def can_reshape(node: fx.Node) -> tuple[int, ...] | str | None:
    """The output shape to reshape to, a reason to stay, or None when ``node`` is no such view."""
    if node.op != "call_function":
        return None
    if node.target is aten.unsqueeze.default:
        source = shape(node.args[0])
        dim = integer(node.args[1])
        if source is not None and dim in (-1, len(source)):
            return None  # XNNPACK takes a trailing unsqueeze as it is
    elif node.target is aten.expand.default:
        source, out = shape(node.args[0]), shape(node)
        if source is None or out is None or numel(source) != numel(out):
            return None  # a real broadcast: remove_expand's
    elif node.target is aten.repeat.default:
        if any(times != 1 for times in integers(node.args[1])):
            return "a repeat that tiles (XNNPACK has no tiling op)"
    elif node.target not in SHAPE_ONLY:
        return None
    out = shape(node)
    if out is None:
        return "output shape unknown or symbolic (pass example_inputs)"
    return out


class ReshapeViews(FxPass):
    """Write squeezes, unsqueezes, flattens, no-op expands and repeats as reshapes; drop aliases,
    cats of one tensor and reshapes to the input's own shape."""

    optimization = MobileOptimizerType.RESHAPE_VIEWS
    summary: ClassVar[str] = (
        "squeeze, unsqueeze, flatten, no-op expand or repeat -> reshape; alias, reshape to x's "
        "shape -> x"
    )
    needs_shapes: ClassVar[bool] = True

    def call(self, gm: fx.GraphModule, ctx: FxContext) -> PassResult[fx.GraphModule]:
        rewrites, skips = 0, Skips()
        for node in list(gm.graph.nodes):
            same = _same_tensor(node)
            if same is not None and all(u.op != "output" for u in node.users):
                replace_node(node, same)
                rewrites += 1
                continue
            found = can_reshape(node)
            if isinstance(found, str):
                skips.add(found)
            elif found is not None:
                with gm.graph.inserting_before(node):
                    reshaped = call(gm.graph, aten.reshape.default, node.args[0], list(found))
                reshaped.meta.update(node.meta)
                replace_node(node, reshaped)
                rewrites += 1
        return PassResult(gm, rewrites, dict(skips))
