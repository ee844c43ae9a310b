"""ATen layers as Vulkan ``create_*_context`` + ``run_*_context`` pairs (``vulkan_rewrite.cpp``).

    linear(x, W, b)                    -> run_linear_context(x, create_linear_context(W.t(), b))
    layer_norm(x, shape, W, b, eps, _) -> run_layernorm_context(x, shape,
                                              create_layernorm_context(W, b, eps))
    conv2d(x, W, b, s, p, d, g)        -> run_conv2d_context(x,
                                              create_conv2d_context(W, b, s, p, d, g, None, None))
    conv_transpose2d(x, W, b, s, p, op, g, d)
                                       -> run_tconv2d_context(x, create_tconv2d_context(
                                              W, b, s, p, op, d, g, None, None))
    conv1d(x, W, b, s, p, d, g)        -> run_conv1d_context(x,
                                              create_conv1d_context(W, b, s, p, d, g))
    gru(x, h, params, flags..)         -> run_gru_context(x, h, create_gru_context(params, flags..))
    lstm(x, [h, c], params, flags..)   -> run_lstm_context(x, h, c, create_lstm_context(..))
    batch_norm(x, W, b, mean, var, training, momentum, eps, cudnn)
                                       -> run_batchnorm_context(x, create_batchnorm_context(
                                              W, b, mean, var, training, momentum, eps, cudnn))

The linear context takes the weight transposed, ``(in_features, out_features)``: upstream emits
``aten::t(W)``; for a constant ``W`` (every frozen ``nn.Linear``) the transpose is done here, once,
so the create call has constant inputs and folds. The transposed conv's arguments change order
(dilation moves before groups). Quantized ops (upstream's ``vulkan_quantized*`` rewrites) are left
out: fxmobile registers no Vulkan quantized kernels. So is upstream's ``aten::_convolution`` ->
``conv2d`` step: scripted graphs hold ``aten::conv2d``, and only traced ones the former.

Upstream rewrites every match and lets the Vulkan context constructors fail later; here each
candidate is checked first and left as ATen, with the reason, when Vulkan cannot run it: string
padding, a weight of the wrong rank, a layer_norm or batch_norm without weight, bias or running
statistics, a batch_norm that uses batch statistics, and a GRU/LSTM that is not batch-first,
bidirectional, without biases, with dropout, with projections or with non-constant flags (the
asserts of upstream's ``Gru.cpp``/``Lstm.cpp``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fxmobile.infra import PassResult, Skips
from fxmobile.script.graph_utils import iter_nodes
from fxmobile.script.stage import ScriptContext, ScriptPass

Node = torch._C.Node
Graph = torch._C.Graph
Value = torch._C.Value
Check = Callable[[Node], "str | None"]  # None when the node can be rewritten, else the reason
Rewriter = Callable[[Graph, Node], None]

_NOT_CONSTANT = object()
_WEIGHT_RANK = {
    "aten::linear": 2,
    "aten::conv2d": 4,
    "aten::conv_transpose2d": 4,
    "aten::conv1d": 3,
}


def _const(value: Value) -> Any:
    """The constant ``value`` holds, or ``_NOT_CONSTANT``."""
    return value.toIValue() if value.node().kind() == "prim::Constant" else _NOT_CONSTANT


def _is_none(value: Value) -> bool:
    return isinstance(value.type(), torch._C.NoneType) or _const(value) is None


def _check_weighted(node: Node) -> str | None:
    """Linear and convolutions: no string padding, a weight of the right rank."""
    kind = node.kind()
    inputs = list(node.inputs())
    if kind != "aten::linear" and not isinstance(inputs[4].type(), torch._C.ListType):
        return f"{kind} with string padding"
    weight = _const(inputs[1])
    if isinstance(weight, torch.Tensor) and weight.dim() != _WEIGHT_RANK[kind]:
        return f"{kind} weight is {weight.dim()}-D"
    return None


def _check_layer_norm(node: Node) -> str | None:
    inputs = list(node.inputs())
    if _is_none(inputs[2]) or _is_none(inputs[3]):
        return "aten::layer_norm without weight and bias (Vulkan needs elementwise_affine=True)"
    return None


def _check_batch_norm(node: Node) -> str | None:
    inputs = list(node.inputs())
    training = _const(inputs[5])
    if training is _NOT_CONSTANT:
        return "aten::batch_norm with a non-constant training flag"
    if training:
        return "aten::batch_norm uses batch statistics (training mode or no running stats)"
    if _is_none(inputs[1]) or _is_none(inputs[2]):
        return "aten::batch_norm without weight and bias (Vulkan needs affine=True)"
    if _is_none(inputs[3]) or _is_none(inputs[4]):
        return "aten::batch_norm without running statistics"
    return None


def _check_rnn(node: Node) -> str | None:
    """aten::gru.input / aten::lstm.input with the flags Vulkan's GRU and LSTM accept."""
    kind = node.kind()
    inputs = list(node.inputs())
    # gru.data / lstm.data (packed sequences) put a batch_sizes tensor where these have lists.
    list_arg = inputs[2] if kind == "aten::gru" else inputs[1]
    if not isinstance(list_arg.type(), torch._C.ListType):
        return f"{kind} on a packed sequence"
    flags = [_const(v) for v in inputs[3:9]]
    if any(f is _NOT_CONSTANT for f in flags):
        return f"{kind} with non-constant flags"
    has_biases, num_layers, dropout, train, bidirectional, batch_first = flags
    params = _const(inputs[2])
    for refused, reason in (
        (not has_biases, "without biases"),
        (train, "in training mode"),
        (bidirectional, "bidirectional"),
        (dropout, "with dropout > 0"),
        (not batch_first, "without batch_first (Vulkan requires batch_first=True)"),
        (isinstance(params, list) and len(params) != 4 * num_layers, "with projections"),
    ):
        if refused:
            return f"{kind} {reason}"
    return None


def _replace(
    graph: Graph,
    node: Node,
    create: str,
    create_args: list[Value],
    run: str,
    run_args: list[Value],
) -> None:
    """``run(*run_args, create(*create_args))`` in place of ``node``, outputs rewired."""
    g: Any = graph  # torch's stubs omit Graph.insert's list form and insertConstant
    with graph.insert_point_guard(node):
        context = g.insert(create, create_args)
        run_node = graph.create(run, [*run_args, context], node.outputsSize())
        graph.insertNode(run_node)
    for old, new in zip(node.outputs(), run_node.outputs(), strict=True):
        new.setType(old.type())
        old.replaceAllUsesWith(new)
    node.destroy()


def _none(graph: Graph, node: Node) -> Value:
    g: Any = graph
    with graph.insert_point_guard(node):
        none: Value = g.insertConstant(None)
    return none


def _rewrite_linear(graph: Graph, node: Node) -> None:
    x, weight, bias = node.inputs()
    g: Any = graph
    constant = _const(weight)
    with graph.insert_point_guard(node):
        if isinstance(constant, torch.Tensor):
            # W.t() once, contiguous, so the create call's inputs stay constant and it folds
            weight_t = g.insertConstant(constant.t().contiguous())
        else:
            weight_t = g.insert("aten::t", [weight])
    _replace(
        graph,
        node,
        "vulkan_prepack::create_linear_context",
        [weight_t, bias],
        "vulkan_prepack::run_linear_context",
        [x],
    )


def _rewrite_layer_norm(graph: Graph, node: Node) -> None:
    x, shape, weight, bias, eps, _ = node.inputs()
    _replace(
        graph,
        node,
        "vulkan_prepack::create_layernorm_context",
        [weight, bias, eps],
        "vulkan_prepack::run_layernorm_context",
        [x, shape],
    )


def _conv_rewriter(create: str, run: str, order: tuple[int, ...], clamp: bool) -> Rewriter:
    def rewrite(graph: Graph, node: Node) -> None:
        inputs = list(node.inputs())
        args = [inputs[i] for i in order]
        if clamp:
            none = _none(graph, node)
            args += [none, none]
        _replace(graph, node, create, args, run, [inputs[0]])

    return rewrite


def _rewrite_gru(graph: Graph, node: Node) -> None:
    inputs = list(node.inputs())
    _replace(
        graph,
        node,
        "vulkan_prepack::create_gru_context",
        inputs[2:9],
        "vulkan_prepack::run_gru_context",
        inputs[:2],
    )


def _rewrite_lstm(graph: Graph, node: Node) -> None:
    inputs = list(node.inputs())
    with graph.insert_point_guard(node):
        unpack = graph.create("prim::ListUnpack", [inputs[1]], 2)
        graph.insertNode(unpack)
    for out in unpack.outputs():
        out.setType(torch._C.TensorType.get())
    h, c = unpack.outputs()
    _replace(
        graph,
        node,
        "vulkan_prepack::create_lstm_context",
        inputs[2:9],
        "vulkan_prepack::run_lstm_context",
        [inputs[0], h, c],
    )


def _rewrite_batch_norm(graph: Graph, node: Node) -> None:
    inputs = list(node.inputs())
    _replace(
        graph,
        node,
        "vulkan_prepack::create_batchnorm_context",
        inputs[1:9],
        "vulkan_prepack::run_batchnorm_context",
        inputs[:1],
    )


# aten kind -> (check returning a skip reason or None, rewrite)
RULES: dict[str, tuple[Check, Rewriter]] = {
    "aten::linear": (_check_weighted, _rewrite_linear),
    "aten::layer_norm": (_check_layer_norm, _rewrite_layer_norm),
    "aten::conv2d": (
        _check_weighted,
        _conv_rewriter(
            "vulkan_prepack::create_conv2d_context",
            "vulkan_prepack::run_conv2d_context",
            (1, 2, 3, 4, 5, 6),
            clamp=True,
        ),
    ),
    "aten::conv_transpose2d": (
        _check_weighted,
        _conv_rewriter(
            "vulkan_prepack::create_tconv2d_context",
            "vulkan_prepack::run_tconv2d_context",
            (1, 2, 3, 4, 5, 7, 6),
            clamp=True,
        ),
    ),
    "aten::conv1d": (
        _check_weighted,
        _conv_rewriter(
            "vulkan_prepack::create_conv1d_context",
            "vulkan_prepack::run_conv1d_context",
            (1, 2, 3, 4, 5, 6),
            clamp=False,
        ),
    ),
    "aten::gru": (_check_rnn, _rewrite_gru),
    "aten::lstm": (_check_rnn, _rewrite_lstm),
    "aten::batch_norm": (_check_batch_norm, _rewrite_batch_norm),
}

# Every create op this pass emits: the ops prepack folding runs once.
CREATE_KINDS = frozenset(
    {
        "vulkan_prepack::create_linear_context",
        "vulkan_prepack::create_layernorm_context",
        "vulkan_prepack::create_conv2d_context",
        "vulkan_prepack::create_tconv2d_context",
        "vulkan_prepack::create_conv1d_context",
        "vulkan_prepack::create_gru_context",
        "vulkan_prepack::create_lstm_context",
        "vulkan_prepack::create_batchnorm_context",
    }
)


def can_rewrite(node: Node) -> str | None:
    """None when ``node`` has a Vulkan form; otherwise the reason it has none."""
    return RULES[node.kind()][0](node)


class InsertVulkanOps(ScriptPass):
    """Rewrite each layer in ``RULES`` as its Vulkan ``create_*_context`` + ``run_*_context`` pair.

    Leaves as ATen, with the reason, what Vulkan cannot run (string padding, a weight of the wrong
    rank, missing affine params or statistics, an RNN configuration its kernels assert against).
    """

    optimization = None  # upstream's Vulkan pipeline cannot switch it off
    summary = (
        "aten::linear / layer_norm / conv1d / conv2d / conv_transpose2d / gru / lstm / "
        "batch_norm -> vulkan_prepack::create_*_context + run_*_context"
    )

    def call(
        self, module: torch.jit.ScriptModule, ctx: ScriptContext
    ) -> PassResult[torch.jit.ScriptModule]:
        rewrites, skips = 0, Skips()
        for method in ctx.methods:
            graph = module._c._get_method(method).graph
            for node in [n for n in iter_nodes(graph) if n.kind() in RULES]:
                check, rewrite = RULES[node.kind()]
                reason = check(node)
                if reason:
                    skips.add(reason)
                    continue
                rewrite(graph, node)
                rewrites += 1
        return PassResult(module, rewrites, dict(skips))
