"""Whether the user's own code may read a tensor's memory layout: a scan of its bytecode.

A module of the user's own class, or a user's function, kept whole by the capture (a leaf,
``fx.wrap``) runs where no graph pass sees it. A rewrite that changes layouts
(``to_channels_last``) changes what such code computes when it branches on
``x.is_contiguous()`` (fuzz finding F13), so it needs to know whether the code may read one.

The scan over-approximates. It reads the names each code object uses (``co_names``: globals,
attributes, methods) and follows what they name: the module's own methods and properties, the
functions and classes of the user's modules, closures and nested functions, the forward of
every submodule of a class of the user's. It says "may read" when a name is a layout reader
(``ops.STRIDE_READERS``, the memory formats, ``getattr``, ``eval``...), and when a name
resolves to something it cannot follow (an object of a user's class held in a global). torch's
own modules and functions are trusted: their results do not depend on strides.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from torch import nn

from fxmobile import ops

# Names whose use may read or set a layout, or name an attribute the scan cannot see.
LAYOUT_NAMES = ops.STRIDE_READERS | frozenset({
    "strides", "storage", "is_non_overlapping_and_dense", "suggest_memory_format",
    "memory_format", "channels_last", "channels_last_3d", "contiguous_format",
    "preserve_format", "__array__", "__array_interface__", "__dict__",
    "getattr", "eval", "exec", "__getattribute__",
})  # fmt: skip
# Values a name may hold that run no code of the user's.
_INERT = (int, float, complex, str, bytes, bool, type(None), types.ModuleType)
# What every module keeps in its __dict__ for torch (_parameters, _modules, hooks...): not the
# user's attributes, which may be private too (self._fn = ...).
_MODULE_INTERNALS = frozenset(vars(nn.Module()))


def may_read_layout(target: nn.Module | Callable[..., Any]) -> bool:
    """Whether calling ``target`` (a module, with every submodule, or a function) may read a
    tensor's strides, as far as the scan can tell (see the module docstring)."""
    seen: set[int] = set()
    if isinstance(target, nn.Module):
        return _modules_read(target, seen)
    return _value_reads(target, {}, seen)


def _modules_read(root: nn.Module, seen: set[int]) -> bool:
    """Whether ``root`` or a submodule has hooks (their code runs too), or is of a user's
    class whose code may read a layout."""
    for module in root.modules():
        if ops.has_hooks(module):
            return True
        if _trusted(type(module)):
            continue
        own = {k: v for k, v in vars(module).items() if k not in _MODULE_INTERNALS}
        owner = {**vars(type(module)), **own}
        if _value_reads(type(module).forward, owner, seen):
            return True
    return False


def _trusted(obj: Any) -> bool:
    """torch's own code, and Python's builtins."""
    module = getattr(obj, "__module__", None) or ""
    return module == "builtins" or module == "torch" or module.startswith("torch.")


def _value_reads(value: Any, owner: dict[str, Any], seen: set[int]) -> bool:
    """Whether ``value``, a name's value, may run code that reads a layout."""
    if isinstance(value, _INERT) or value is None:
        return False
    if id(value) in seen:  # also ends a list that holds itself
        return False
    seen.add(id(value))
    if isinstance(value, tuple | list | frozenset | set):
        return any(_value_reads(v, owner, seen) for v in value)
    if isinstance(value, dict):
        return any(_value_reads(v, owner, seen) for v in value.values())
    if isinstance(value, staticmethod | classmethod):
        return _value_reads(value.__func__, owner, seen)
    if isinstance(value, property):
        return any(_value_reads(f, owner, seen) for f in (value.fget, value.fset))
    if isinstance(value, types.MethodType):
        return _value_reads(value.__func__, owner, seen)
    if _trusted(value):
        return False
    if isinstance(value, types.FunctionType):
        cells = [c.cell_contents for c in value.__closure__ or () if _filled(c)]
        code = value.__code__
        return _code_reads(code, value.__globals__, owner, seen) or _value_reads(cells, owner, seen)
    if isinstance(value, type):
        return any(_value_reads(v, dict(vars(value)), seen) for v in vars(value).values())
    if isinstance(value, nn.Module):
        return _modules_read(value, seen)
    return True  # an object whose calls the scan cannot follow


def _code_reads(
    code: types.CodeType, globals_: dict[str, Any], owner: dict[str, Any], seen: set[int]
) -> bool:
    """Whether ``code`` names a layout reader, or a global or an attribute of its module
    (``owner``) that may read one. A name may be both (``self.f`` and a global ``f``): both
    are followed."""
    if LAYOUT_NAMES & set(code.co_names):
        return True
    for name in code.co_names:
        # a name in the globals is the user's, even where it shadows a builtin (``len``)
        for space in (globals_, owner):
            if name in space and _value_reads(space[name], owner, seen):
                return True
    nested = (c for c in code.co_consts if isinstance(c, types.CodeType))
    return any(_code_reads(c, globals_, owner, seen) for c in nested)


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # a cell not filled yet
        return False
    return True
