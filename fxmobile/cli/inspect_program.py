"""``fxmobile inspect model.pte``: an ExecuTorch program's delegates, kernel calls and size.

Read from the file itself (``fxmobile.executorch.program_file``), whatever made it: per method,
its inputs, each delegate (backend, size of its blob, calls) and every operator left on kernels
outside the delegates with its number of calls; then where the file's bytes are.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from fxmobile.cli.common import table
from fxmobile.executorch.program_file import MethodFacts, ProgramFile, read_program
from fxmobile.report.render import format_bytes

__all__ = ["read_program", "render"]


def render(path: Path, found: ProgramFile, fmt: str) -> str:
    """The tables of ``fxmobile inspect`` for a ``.pte`` in ``fmt`` (table or markdown)."""
    methods = ", ".join(m.name for m in found.methods)
    parts = [
        f"{path}: ExecuTorch program, {format_bytes(found.nbytes)}, methods {methods}",
    ]
    for method in found.methods:
        parts += _method(method, fmt)
    parts.append(
        f"where the bytes are: delegates' graphs "
        f"{format_bytes(sum(d.nbytes for m in found.methods for d in m.delegates))}, packed "
        f"weights (named data, {found.named_data} entries) {format_bytes(found.named_data_bytes)}, "
        f"constant tensors outside the delegates {format_bytes(found.constant_bytes)}, of "
        f"{format_bytes(found.nbytes)}"
    )
    return "\n\n".join(parts)


def _method(method: MethodFacts, fmt: str) -> list[str]:
    inputs = ", ".join(
        f"{'x'.join(map(str, i.shape))} {i.dtype or '?'}" if i.kind == "tensor" else i.kind
        for i in method.inputs
    )
    backends = Counter(d.backend for d in method.delegates)
    listed = ", ".join(f"{name} {n}" for name, n in backends.most_common())
    parts = [
        f"{method.name}({inputs}): {method.delegate_calls} delegate call(s)"
        + (f" ({listed})" if listed else "")
        + f", {method.kernel_call_count} kernel call(s) outside them"
    ]
    if method.delegates:
        rows: list[list[object]] = [
            [i, d.backend, format_bytes(d.nbytes), d.calls] for i, d in enumerate(method.delegates)
        ]
        parts.append(table(rows, ["delegate", "backend", "size", "calls"], fmt))
    if method.kernel_calls:
        rows = [[op, n] for op, n in method.kernel_calls.items()]
        parts.append(
            table(rows, ["operator outside the delegates (portable kernels)", "calls"], fmt)
        )
    else:
        parts.append("operators outside the delegates: none")
    if method.prim_calls:
        listed = ", ".join(f"{op} {n}" for op, n in method.prim_calls.items())
        parts.append(f"ExecuTorch's own primitives (views, scalar arithmetic): {listed}")
    return parts
