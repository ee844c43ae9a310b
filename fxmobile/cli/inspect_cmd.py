"""``fxmobile inspect FILE``: what a saved model holds and what a mobile runtime needs to run it.

Shown: file size, methods, the marker attributes backends set, operator counts per method (the
report's ``op_histogram``: submodule calls inlined, bookkeeping nodes left out), the ops a mobile
runtime still dispatches one by one (``unfused_ops``), the packed contexts (custom-class objects
held as attributes or graph constants, e.g. ``__torch__.torch.classes.xnnpack.Conv2dOpContext``,
with the shape of the first tensor of their state: the weight), and the operator list the lite
interpreter needs and its mobile compatibility (when the file has lite-interpreter bytecode): its
bytecode and operator versions, the operators whose meaning torch has changed, and which
reference runtime loads it as saved or after ``fxmobile.runtime.compat.backport_for``, from
the ranges measured on those runtimes (``fxmobile check`` loads it in them for real).

An ExecuTorch program (``.pte``, recognised by its bytes) shows its delegates, the kernel calls
outside them and its size instead (``fxmobile.cli.inspect_program``).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.jit.mobile
from torch.utils.bundled_inputs import _get_bundled_inputs_attributes_and_methods

from fxmobile.cli import inspect_program
from fxmobile.cli.common import TABLE_FORMATS, CliError, add_format, table
from fxmobile.cli.script_files import has_bytecode, load_lite, load_script_module
from fxmobile.executorch.program_file import is_program
from fxmobile.report.render import compatibility_table, format_bytes
from fxmobile.runtime.compat import file_compatibility
from fxmobile.script.graph_utils import iter_nodes, op_histogram, unfused_ops
from fxmobile.script.jit_passes import jit

MARKERS = ("mobile_optimized", "optimized_for_vulkan", "optimized_for_metal")
_CUSTOM_CLASS_PREFIX = "__torch__.torch.classes."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``inspect``'s arguments: the file, the output format, and whether to list every context."""
    parser.add_argument(
        "file",
        type=Path,
        metavar="FILE",
        help="a saved TorchScript file (.pt, .ptl) or an ExecuTorch program (.pte)",
    )
    add_format(parser)
    parser.add_argument(
        "--contexts",
        action="store_true",
        help="list every packed context, not only counts (TorchScript files)",
    )


@dataclass(frozen=True)
class PackedContext:
    """One packed context: where the module holds it, its class and its weight's shape."""

    where: str  # the attribute's path, or "constant in <method>"
    class_name: str
    weight_shape: list[int] | None


@dataclass
class Inspection:
    """Everything ``fxmobile inspect`` shows about one file, as plain data (``--format json``)."""

    file: str
    file_bytes: int
    model: str
    methods: list[str]
    markers: dict[str, bool | None]  # None: the attribute is absent
    ops: dict[str, dict[str, int]]  # method -> operator -> count
    unfused_ops: dict[str, int]
    packed_contexts: list[PackedContext]
    lite_operators: list[str] | None
    lite_operators_note: str | None
    compatibility: dict[str, Any] | None  # FileCompatibility.to_dict(); None without bytecode
    # each bundled input set for forward, one "1x3x224x224 float32" per argument; None: none
    bundled_inputs: list[list[str]] | None = None


def run(args: argparse.Namespace) -> int:
    """Print what ``args.file`` holds; always 0 (an unreadable file raises ``CliError``)."""
    console = args.console
    if not args.file.is_file():
        raise CliError(f"{args.file}: no such file")
    if is_program(args.file):
        program = inspect_program.read_program(args.file)
        if args.format == "json":
            console.result(json.dumps({"file": str(args.file), **program.to_dict()}, indent=2))
        else:
            console.result(inspect_program.render(args.file, program, args.format))
        return 0
    found = inspect_file(args.file)
    if args.format == "json":
        console.result(json.dumps(asdict(found), indent=2))
    else:
        console.result(_render(found, args.format, args.contexts))
    return 0


def inspect_file(path: Path) -> Inspection:
    """What the TorchScript file at ``path`` holds and what a mobile runtime needs to run it."""
    module = load_script_module(path)
    # the methods torch.utils.bundled_inputs adds produce inputs; they are not the model
    helpers = set(_get_bundled_inputs_attributes_and_methods(module)[0])
    names = [name for name in module._c._method_names() if name not in helpers]
    methods = sorted(names, key=lambda name: (name != "forward", name))
    operators, note = _lite_operators(path)
    compatibility = file_compatibility(path) if has_bytecode(path) else None
    return Inspection(
        file=str(path),
        file_bytes=path.stat().st_size,
        model=str(module.original_name),
        methods=methods,
        markers={name: _marker(module, name) for name in MARKERS},
        ops={name: dict(op_histogram(module, [name])) for name in methods},
        unfused_ops=dict(unfused_ops(module, methods)),
        packed_contexts=packed_contexts(module, methods),
        lite_operators=operators,
        lite_operators_note=note,
        compatibility=None if compatibility is None else compatibility.to_dict(),
        bundled_inputs=_bundled_inputs(module),
    )


def _bundled_inputs(module: torch.jit.ScriptModule) -> list[list[str]] | None:
    """Shape and dtype of each argument of each bundled input set for forward."""
    if not hasattr(module, "get_all_bundled_inputs"):
        return None
    return [
        [
            f"{'x'.join(map(str, x.shape)) or 'scalar'} {str(x.dtype).removeprefix('torch.')}"
            if isinstance(x, torch.Tensor)
            else type(x).__name__
            for x in inputs
        ]
        for inputs in module.get_all_bundled_inputs()
    ]


def packed_contexts(module: torch.jit.ScriptModule, methods: list[str]) -> list[PackedContext]:
    """Custom-class objects held as attributes (recursively) or as constants in ``methods``."""
    found = []
    for name, value in jit._jit_debug_module_iterators(module._c)["named_attributes_r"]:
        if _is_custom_class(value):
            found.append(_context(name, value))
    for method in methods:
        for node in iter_nodes(module._c._get_method(method).inlined_graph):
            if node.kind() != "prim::Constant" or not node.hasAttribute("value"):
                continue
            if node.kindOf("value") == "ival" and _is_custom_class(node.ival("value")):
                found.append(_context(f"constant in {method}", node.ival("value")))
    return found


def _is_custom_class(value: object) -> bool:
    if not isinstance(value, torch.ScriptObject):
        return False
    return str(value._type().qualified_name()).startswith(_CUSTOM_CLASS_PREFIX)


def _context(where: str, value: Any) -> PackedContext:
    shape = None
    if value._has_method("__getstate__"):
        weight = _first_tensor(value.__getstate__())
        shape = None if weight is None else list(weight.shape)
    return PackedContext(where, str(value._type().qualified_name()), shape)


def _first_tensor(state: object) -> torch.Tensor | None:
    if isinstance(state, torch.Tensor):
        return state
    if isinstance(state, list | tuple):
        for item in state:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _marker(module: torch.jit.ScriptModule, name: str) -> bool | None:
    return bool(module._c.getattr(name)) if module._c.hasattr(name) else None


def _lite_operators(path: Path) -> tuple[list[str] | None, str | None]:
    if not has_bytecode(path):
        return None, (
            "no lite-interpreter bytecode in this file (torch.jit.save writes none); "
            "fxmobile optimize FILE -o out.ptl writes a file that has it"
        )
    try:
        lite = load_lite(path)
    except RuntimeError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None, f"the lite interpreter cannot load this file ({first})"
    return sorted(torch.jit.mobile._export_operator_list(lite)), None


def _render(found: Inspection, fmt: str, every_context: bool) -> str:
    parts = [
        f"{found.file}: {format_bytes(found.file_bytes)}, model {found.model}, "
        f"methods {', '.join(found.methods)}",
        "markers: "
        + ", ".join(
            f"{name}={'absent' if value is None else value}"
            for name, value in found.markers.items()
        ),
        _ops_table(found, fmt),
        _unfused_line(found.unfused_ops),
        _contexts_table(found.packed_contexts, fmt, every_context),
        _bundled_line(found.bundled_inputs),
    ]
    if found.lite_operators is None:
        parts.append(f"lite-interpreter operators: unknown, {found.lite_operators_note}")
    else:
        listing = textwrap.fill(", ".join(found.lite_operators), width=100)
        parts.append(f"lite-interpreter operators ({len(found.lite_operators)}):\n{listing}")
    if found.compatibility is not None:
        parts.append(compatibility_table(found.compatibility, TABLE_FORMATS[fmt]))
    return "\n\n".join(parts)


def _ops_table(found: Inspection, fmt: str) -> str:
    totals: Counter[str] = Counter()
    for counts in found.ops.values():
        totals.update(counts)
    kinds = sorted(totals, key=lambda kind: (-totals[kind], kind))
    rows: list[list[object]] = [
        [kind, *(found.ops[method].get(kind, 0) for method in found.methods)] for kind in kinds
    ]
    return table(rows, ["operator", *found.methods], fmt)


def _bundled_line(bundled: list[list[str]] | None) -> str:
    if bundled is None:
        return "bundled inputs: none (fxmobile check then needs --input-shape)"
    sets = "; ".join(", ".join(arguments) for arguments in bundled)
    return f"bundled inputs for forward ({len(bundled)}): {sets}"


def _unfused_line(unfused: dict[str, int]) -> str:
    total = sum(unfused.values())
    ranked = sorted(unfused.items(), key=lambda kv: (-kv[1], kv[0]))
    detail = f" ({', '.join(f'{kind} {n}' for kind, n in ranked)})" if ranked else ""
    return f"ops left unfused: {total}{detail}"


def _contexts_table(contexts: list[PackedContext], fmt: str, every_context: bool) -> str:
    if not contexts:
        return "packed contexts: none"
    if every_context:
        rows: list[list[object]] = [
            [c.class_name, c.where, _shape(c.weight_shape)] for c in contexts
        ]
        return table(rows, ["packed context", "held as", "weight shape"], fmt, numbers=False)
    counts = Counter(c.class_name for c in contexts)
    rows = [[name, count] for name, count in sorted(counts.items())]
    return table(rows, ["packed context", "count"], fmt) + "\n(--contexts lists each one)"


def _shape(shape: list[int] | None) -> str:
    return "?" if shape is None else "x".join(str(d) for d in shape)
