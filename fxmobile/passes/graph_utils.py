"""Small graph helpers shared by the FX passes: lookups, purity, constants.

Everything here matches on real targets (module types, function objects), never on node names.
"""

from __future__ import annotations

import operator
from collections.abc import Container
from typing import Any

import torch
from torch import fx, nn

# Functions whose call mutates an argument or global state; never removed as dead code.
_IMPURE_FUNCTIONS: frozenset[Any] = frozenset(
    {operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv}
)


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


def is_inplace_module(module: nn.Module) -> bool:
    return bool(getattr(module, "inplace", False))


def is_pure(gm: fx.GraphModule, node: fx.Node) -> bool:
    """True when removing ``node`` (if unused) cannot change what the model computes.

    Conservative on purpose: in-place methods and functions (``relu_``, ``inplace=True``,
    ``out=``), ``operator.setitem``, in-place modules, any module outside ``torch.nn`` (an
    opaque leaf may update its own state) and any function outside torch, ``operator`` and
    ``math`` (a ``torch.fx.wrap``-ed user function may write to its arguments) count as impure.
    """
    if node.op in ("placeholder", "output"):
        return False
    if node.op == "get_attr":
        return True
    if node.kwargs.get("inplace") or "out" in node.kwargs:
        return False
    if node.op == "call_method":
        name = str(node.target)
        return not (name.endswith("_") and not name.endswith("__"))
    if node.op == "call_function":
        if node.target in _IMPURE_FUNCTIONS:
            return False
        name = getattr(node.target, "__name__", "")
        if name.endswith("_") and not name.endswith("__"):
            return False
        if not _is_library_function(node.target):
            # a user function kept opaque by torch.fx.wrap: it may write to its arguments
            # (torchvision's mvit ``_add_shortcut`` adds into ``x`` and returns nothing used)
            return False
        return not node.is_impure()
    if node.op == "call_module":
        module = module_of(gm, node)
        assert module is not None
        if is_inplace_module(module):
            return False
        return type(module).__module__.startswith("torch.nn.") and not getattr(
            module, "_is_impure", False
        )
    return False


# Where the functions fx records come from when they are torch's own or Python's arithmetic;
# anything else is user code.
_LIBRARY_MODULES = ("torch", "operator", "math", "_operator", "builtins")


def _is_library_function(target: object) -> bool:
    module = getattr(target, "__module__", None) or ""
    if not module and hasattr(target, "__self__"):  # a builtin method, e.g. torch._C._nn.*
        module = type(target.__self__).__module__ or ""
    root = module.split(".", 1)[0]
    return root in _LIBRARY_MODULES


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


# Ops whose result may share memory with their input: an in-place write through one reaches it.
VIEW_OPS = frozenset(
    {
        "view",
        "reshape",
        "flatten",
        "transpose",
        "permute",
        "squeeze",
        "unsqueeze",
        "expand",
        "narrow",
        "select",
        "t",
        "contiguous",
        "detach",
        "view_as",
        "unflatten",
        "getitem",
    }
)


# Modules whose output can be their input or a view of it: a write to the output reaches the
# input (nn.Flatten is torch.flatten, a view of contiguous input; eval-mode dropout and
# Identity return the input itself).
ALIASING_MODULES: tuple[type[nn.Module], ...] = (
    nn.Flatten,
    nn.Unflatten,
    nn.Identity,
    nn.modules.dropout._DropoutNd,
)


def written_in_place(gm: fx.GraphModule, node: fx.Node, skip: fx.Node | None = None) -> bool:
    """Whether an in-place op writes to ``node``'s value, directly or through a view of it.

    ``skip`` is a user to ignore (the node being considered for removal itself).
    """
    stack = [node]
    while stack:
        current = stack.pop()
        for user in current.users:
            if user is skip or user.op == "output":
                continue
            if not is_pure(gm, user):
                return True
            name = user.target if user.op == "call_method" else getattr(user.target, "__name__", "")
            aliasing_module = user.op == "call_module" and isinstance(
                gm.get_submodule(str(user.target)), ALIASING_MODULES
            )
            if name in VIEW_OPS or aliasing_module:
                stack.append(user)
    return False
