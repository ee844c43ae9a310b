"""Small graph helpers shared by the FX passes: lookups, purity, constants.

Everything here matches on real targets (module types, function objects), never on node names.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import torch
from torch import fx, nn

from fxmobile import ops


def module_of(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    """The submodule a ``call_module`` node calls, else None."""
    if node.op != "call_module":
        return None
    assert isinstance(node.target, str)
    return gm.get_submodule(node.target)


def attr_of(gm: fx.GraphModule, node: fx.Node) -> Any:
    """The value a ``get_attr`` node reads (a parameter, buffer or constant tensor)."""
    assert node.op == "get_attr" and isinstance(node.target, str)
    obj: Any = gm
    for part in node.target.split("."):
        obj = getattr(obj, part)
    return obj


def is_pure(gm: fx.GraphModule, node: fx.Node) -> bool:
    """True when removing ``node`` (if unused) cannot change what the model computes.

    What the op does comes from ``fxmobile.ops``: in-place ops and ``out=`` / ``inplace=True``
    calls, module calls of anything outside ``torch.nn`` or with hooks, and user functions kept
    opaque by ``torch.fx.wrap`` (torchvision's mvit ``_add_shortcut`` adds into ``x`` and
    returns nothing used) are impure, and so are calls fx itself calls side-effecting
    (``torch._assert``).
    """
    if node.op in ("placeholder", "output"):
        return False
    if node.op == "call_function" and node.is_impure():
        return False
    module = module_of(gm, node)
    if module is not None and getattr(module, "_is_impure", False):
        return False
    return not ops.fx_op(gm, node).writes


# what a user may ask of a tensor without reading its values (timm's BatchNormAct2d asserts
# ``x.ndim == 4`` on the conv output it normalizes)
_METADATA_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device"})
_METADATA_METHODS = frozenset({"size", "dim", "ndimension"})


def reads_values(user: fx.Node, node: fx.Node) -> bool:
    """Whether ``user`` reads ``node``'s values, not only its shape, rank, dtype or device
    (``getattr(node, "ndim")``, ``node.size()``): a rewrite that keeps those can give such a
    user the rewritten tensor."""
    if user.op == "call_function" and user.target is getattr:
        return user.args[0] is not node or user.args[1] not in _METADATA_ATTRIBUTES
    if user.op == "call_method" and user.target in _METADATA_METHODS:
        return user.args[0] is not node or node in user.args[1:] or node in user.kwargs.values()
    return True


def value_users(node: fx.Node) -> list[fx.Node]:
    """The users of ``node`` that read its values (``reads_values``)."""
    return [user for user in node.users if reads_values(user, node)]


def replace_node(node: fx.Node, value: fx.Node) -> None:
    """Route every user of ``node`` to ``value`` and erase ``node``."""
    node.replace_all_uses_with(value)
    node.graph.erase_node(node)


def fresh_attr_name(gm: fx.GraphModule, base: str, taken: Container[str] = frozenset()) -> str:
    """An attribute name on ``gm`` derived from ``base`` that is not taken yet (on ``gm``, nor
    in ``taken``)."""
    base = base.replace(".", "_")
    name, i = base, 0
    while hasattr(gm, name) or name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def add_constant(gm: fx.GraphModule, base: str, value: torch.Tensor) -> str:
    """Register ``value`` as a buffer of ``gm`` (so it is counted, saved and scripted)."""
    name = fresh_attr_name(gm, base)
    gm.register_buffer(name, value.detach())
    return name


def tensor_meta(node: fx.Node) -> Any:
    """Shape/dtype metadata left by shape propagation, or None when there was none."""
    return node.meta.get("tensor_meta")


def erase_unused_attributes(gm: fx.GraphModule) -> int:
    """Drop submodules, parameters and buffers of ``gm`` that no node refers to any more."""
    used = {str(n.target) for n in gm.graph.nodes if n.op in ("get_attr", "call_module")}
    removed = 0
    for name, _ in list(gm.named_parameters(recurse=False)) + list(gm.named_buffers(recurse=False)):
        if name not in used:
            delattr(gm, name)
            removed += 1
    before = sum(1 for _ in gm.modules())
    gm.delete_all_unused_submodules()
    return removed + before - sum(1 for _ in gm.modules())


def written_in_place(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether an in-place op writes to ``node``'s value, directly or through a view of it.

    A user that may write (``fxmobile.ops``) counts as a write; a user that may return a view is
    followed.
    """
    stack = [node]
    seen: set[fx.Node] = set()
    while stack:
        current = stack.pop()
        for user in current.users:
            if user.op == "output" or user in seen:
                continue
            seen.add(user)
            info = ops.fx_op(gm, user)
            if info.writes or not is_pure(gm, user):
                return True
            if info.view:
                stack.append(user)
    return False
