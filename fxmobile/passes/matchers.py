"""Matching the layers the folds rewrite: BatchNorm calls and the producers they follow.

One matcher for ``fold_batchnorm``, ``decompose_batchnorm`` and ``fold_conv_arithmetic`` (and
the module check ``inline_modules`` uses), so a check and a rewrite never disagree. Forms:

- BatchNorm: ``nn.BatchNorm1d/2d/3d``, ``nn.SyncBatchNorm`` (in eval mode with running stats it
  is exactly ``F.batch_norm``: it synchronizes only when training), ``F.batch_norm`` and
  ``torch.batch_norm`` with constant statistics and ``training`` the constant False.
- Producers: ``nn.Conv1d/2d/3d``, ``nn.ConvTranspose1d/2d/3d``, ``nn.Linear``, and
  ``F.conv*`` / ``F.conv_transpose*`` / ``F.linear`` whose weight and bias are ``get_attr``
  tensors.

A module call matches only when calling the module runs exactly its class's ``forward``: the
exact type (a subclass may override ``forward``), no forward hooks or pre-hooks (they would see,
or skip, the folded values), no ``forward`` set on the instance. Every refusal is a skip reason
the report shows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxmobile import ops
from fxmobile.passes.affine_fold import PRODUCER_TYPES, out_channels
from fxmobile.passes.graph_utils import attr_of, module_of

# BatchNorm module -> the input ranks its forward accepts (None: any rank >= 2).
BATCHNORM_MODULES: dict[type[nn.Module], frozenset[int] | None] = {
    nn.BatchNorm1d: frozenset({2, 3}),
    nn.BatchNorm2d: frozenset({4}),
    nn.BatchNorm3d: frozenset({5}),
    nn.SyncBatchNorm: None,
}

# function -> its parameter names in order (fx keeps arguments positional or keyword as written)
BATCHNORM_FUNCTIONS: dict[Any, tuple[str, ...]] = {
    F.batch_norm: (
        "input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps",
    ),
    torch.batch_norm: (
        "input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps",
        "cudnn_enabled",
    ),
}  # fmt: skip
_DEFAULTS: dict[str, Any] = {"weight": None, "bias": None, "training": False, "eps": 1e-5}

# producer module -> (spatial dims, transposed); Linear has 0 spatial dims.
PRODUCER_MODULES: dict[type[nn.Module], tuple[int, bool]] = {
    nn.Conv1d: (1, False),
    nn.Conv2d: (2, False),
    nn.Conv3d: (3, False),
    nn.ConvTranspose1d: (1, True),
    nn.ConvTranspose2d: (2, True),
    nn.ConvTranspose3d: (3, True),
    nn.Linear: (0, False),
}

CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
CONV_T_ARGS = (*CONV_ARGS[:5], "output_padding", "groups", "dilation")
LINEAR_ARGS = ("input", "weight", "bias")

# function -> (spatial dims, transposed, argument names in order)
PRODUCER_FUNCTIONS: dict[Callable[..., Any], tuple[int, bool, tuple[str, ...]]] = {
    F.conv1d: (1, False, CONV_ARGS),
    F.conv2d: (2, False, CONV_ARGS),
    F.conv3d: (3, False, CONV_ARGS),
    F.conv_transpose1d: (1, True, CONV_T_ARGS),
    F.conv_transpose2d: (2, True, CONV_T_ARGS),
    F.conv_transpose3d: (3, True, CONV_T_ARGS),
    F.linear: (0, False, LINEAR_ARGS),
}


def why_customized(module: nn.Module) -> str | None:
    """Why calling ``module`` may do more than its class's ``forward``, or None."""
    if ops.has_hooks(module):
        return f"{type(module).__name__} has forward hooks"
    if "forward" in vars(module):
        return f"{type(module).__name__} instance has a forward of its own"
    return None


def arg(node: fx.Node, names: Sequence[str], name: str, default: Any = None) -> Any:
    """Argument ``name`` of a call whose parameters are ``names``, positional or keyword."""
    i = names.index(name)
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def set_arg(node: fx.Node, names: Sequence[str], name: str, value: fx.Node) -> None:
    """Replace argument ``name`` where the call passes it (positionally or by keyword)."""
    i = names.index(name)
    if len(node.args) > i:
        node.update_arg(i, value)
    else:
        node.update_kwarg(name, value)


def constant_tensor(gm: fx.GraphModule, value: Any) -> torch.Tensor | str | None:
    """The tensor a ``get_attr`` argument reads, None for a literal None, else ``"dynamic"``."""
    if value is None:
        return None
    if isinstance(value, fx.Node) and value.op == "get_attr":
        tensor = attr_of(gm, value)
        if isinstance(tensor, torch.Tensor):
            return tensor
    return "dynamic"


@dataclass(frozen=True)
class BatchNormCall:
    """An inference BatchNorm: its node, its input and its constants."""

    node: fx.Node
    source: fx.Node
    mean: torch.Tensor
    var: torch.Tensor
    gamma: torch.Tensor | None
    beta: torch.Tensor | None
    eps: float
    ranks: frozenset[int] | None  # input ranks the BN accepts; None: any
    name: str  # base name for buffers made from it

    @property
    def rank(self) -> int | None:
        """The input rank when the BN accepts only one (BatchNorm2d: 4)."""
        return next(iter(self.ranks)) if self.ranks is not None and len(self.ranks) == 1 else None

    def scale_shift(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``s = gamma / sqrt(var + eps)`` and ``t = beta - mean * s``, in float64."""
        f64 = torch.float64
        var = self.var.detach().to(f64)
        gamma = torch.ones_like(var) if self.gamma is None else self.gamma.detach().to(f64)
        beta = torch.zeros_like(var) if self.beta is None else self.beta.detach().to(f64)
        s = gamma / torch.sqrt(var + self.eps)
        return s, beta - self.mean.detach().to(f64) * s


def match_batchnorm(gm: fx.GraphModule, node: fx.Node) -> BatchNormCall | str | None:
    """``node`` as an inference BatchNorm, the reason it is not one to rewrite, or None when
    it is no BatchNorm at all."""
    if node.op == "call_module":
        return _module_batchnorm(gm, node)
    if node.op == "call_function" and node.target in BATCHNORM_FUNCTIONS:
        return _functional_batchnorm(gm, node)
    return None


def _module_batchnorm(gm: fx.GraphModule, node: fx.Node) -> BatchNormCall | str | None:
    bn = module_of(gm, node)
    if not isinstance(bn, nn.modules.batchnorm._BatchNorm):
        return None
    if type(bn) not in BATCHNORM_MODULES:
        return f"BN subclass {type(bn).__name__} may override forward"
    if bn.training:
        return "BN in training mode"
    # in eval, BN uses batch stats when it has no buffers (track_running_stats=False)
    if bn.running_mean is None or bn.running_var is None:
        return "BN has no running stats"
    customized = why_customized(bn)
    if customized:
        return customized
    source = node.args[0] if node.args else node.kwargs.get("input")
    if not isinstance(source, fx.Node):
        return "BN input is not a tensor node"
    ranks = BATCHNORM_MODULES[type(bn)]
    mean, var = bn.running_mean, bn.running_var
    return BatchNormCall(
        node, source, mean, var, bn.weight, bn.bias, float(bn.eps), ranks, str(node.target)
    )


def _functional_batchnorm(gm: fx.GraphModule, node: fx.Node) -> BatchNormCall | str:
    names = BATCHNORM_FUNCTIONS[node.target]
    training = arg(node, names, "training", _DEFAULTS["training"])
    if training is True:
        return "BN in training mode"
    eps = arg(node, names, "eps", _DEFAULTS["eps"])
    if training is not False or type(eps) not in (int, float):
        return "BN training flag or eps is not a constant"
    stats = [
        constant_tensor(gm, arg(node, names, name, _DEFAULTS.get(name)))
        for name in ("running_mean", "running_var", "weight", "bias")
    ]
    if any(isinstance(s, str) for s in stats):
        return "BN stats or affine params are not constants"
    mean, var, gamma, beta = (s if isinstance(s, torch.Tensor) else None for s in stats)
    if mean is None or var is None:
        return "BN has no running stats"
    source = arg(node, names, "input")
    if not isinstance(source, fx.Node):
        return "BN input is not a tensor node"
    return BatchNormCall(node, source, mean, var, gamma, beta, float(eps), None, node.name)


@dataclass(frozen=True)
class Producer:
    """A conv / transposed conv / linear call: ``W * x + b`` per output channel."""

    node: fx.Node
    label: str  # "Conv2d", "F.linear", ...
    spatial_dims: int  # 0 for linear
    transposed: bool
    groups: int
    out_channels: int
    weight: torch.Tensor
    module: nn.Module | None  # None for the functional form
    arg_names: tuple[str, ...] = ()  # functional form only

    @property
    def kind(self) -> str:
        """``"linear"`` or ``"conv"``, for skip reasons."""
        return "linear" if self.spatial_dims == 0 else "conv"

    @property
    def channel_rank(self) -> int:
        """The output rank at which dim 1 holds the output channels."""
        return self.spatial_dims + 2 if self.spatial_dims else 2

    @property
    def ranks(self) -> frozenset[int] | None:
        """Output ranks the producer can give: a conv takes batched or unbatched input."""
        if not self.spatial_dims:
            return None
        return frozenset({self.spatial_dims + 1, self.spatial_dims + 2})


def match_producer(gm: fx.GraphModule, node: fx.Node) -> Producer | str | None:
    """``node`` as a conv / transposed conv / linear to fold into, the reason it cannot take a
    fold, or None when it is none of those at all."""
    if node.op == "call_module":
        module = module_of(gm, node)
        assert module is not None
        if type(module) not in PRODUCER_MODULES:
            base = next((t for t in PRODUCER_TYPES if isinstance(module, t)), None)
            if base is None:
                return None
            name = type(module).__name__
            return f"{name} is a subclass of {base.__name__} (may override forward)"
        customized = why_customized(module)
        if customized:
            return f"producer module: {customized}"
        dims, transposed = PRODUCER_MODULES[type(module)]
        groups = int(getattr(module, "groups", 1))
        weight: torch.Tensor = module.weight  # type: ignore[assignment]
        label = type(module).__name__
        return Producer(node, label, dims, transposed, groups, out_channels(module), weight, module)
    if node.op != "call_function" or node.target not in PRODUCER_FUNCTIONS:
        return None
    dims, transposed, names = PRODUCER_FUNCTIONS[node.target]
    kind = "linear" if dims == 0 else "conv"
    weight_ = constant_tensor(gm, arg(node, names, "weight"))
    bias = constant_tensor(gm, arg(node, names, "bias"))
    if not isinstance(weight_, torch.Tensor) or isinstance(bias, str):
        return f"functional {kind} weight or bias is not a get_attr tensor"
    groups = arg(node, names, "groups", 1) if dims else 1
    if type(groups) is not int:
        return f"functional {kind} groups is not a constant"
    if weight_.dim() != (dims + 2 if dims else 2):
        return f"functional {kind} weight has an unexpected rank"
    out = weight_.shape[1] * groups if transposed else weight_.shape[0]
    label = f"F.{getattr(node.target, '__name__', kind)}"
    return Producer(node, label, dims, transposed, groups, int(out), weight_, None, names)
