"""What the entry points return: the optimized module and the report of how it was made."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.jit.mobile
from torch import fx

from fxmobile.errors import ScriptingError
from fxmobile.report import FileFacts, Report
from fxmobile.runtime.compat import backport_for, file_compatibility
from fxmobile.script.serialization import lite_interpreter_bytes


@dataclass
class FxResult:
    """The optimized ``GraphModule`` and the report of how it was made."""

    graph_module: fx.GraphModule
    report: Report

    def __repr__(self) -> str:
        from fxmobile.report.summary import one_line

        nodes = len(self.graph_module.graph.nodes)
        return f"FxResult: graph_module with {nodes} nodes\n  report: {one_line(self.report)}"

    def _repr_html_(self) -> str:
        from fxmobile.report.html import report_html

        nodes = len(self.graph_module.graph.nodes)
        holds = [("graph_module", f"torch.fx.GraphModule, {nodes} nodes, runs like the model")]
        return report_html(self.report, "FxResult", holds)


@dataclass
class MobileResult:
    """The optimized ``ScriptModule`` and the report of both stages."""

    module: torch.jit.ScriptModule
    report: Report

    target_runtime: str | None = None

    def __repr__(self) -> str:
        from fxmobile.report.summary import one_line

        target = f" for torch {self.target_runtime}" if self.target_runtime else ""
        module = f"ScriptModule {self.module.original_name}{target}"
        return f"MobileResult: module {module}\n  report: {one_line(self.report)}"

    def _repr_html_(self) -> str:
        from fxmobile.report.html import report_html

        target = f", for torch {self.target_runtime}" if self.target_runtime else ""
        holds = [
            ("module", f"ScriptModule {self.module.original_name}, optimized{target}"),
            ("save(path)", "writes the lite-interpreter file an app loads"),
        ]
        return report_html(self.report, "MobileResult", holds)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a lite-interpreter file (load it with ``_load_for_lite_interpreter``), in the
        bytecode ``target_runtime`` reads; the report's ``file`` then describes that file.

        The bytes are loaded back in the lite interpreter first: a file it cannot read (an output
        type its type parser does not know, such as a ``Union``) is a ``ScriptingError``, and
        nothing is written."""
        data = lite_file(self.module, self.target_runtime)
        try:
            torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(data))
        except RuntimeError as exc:
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            raise ScriptingError(
                f"the lite interpreter cannot load {self.report.model_name}'s file: "
                f"{lines[0] if lines else type(exc).__name__}. Fix: return tensors, or a tuple, "
                "list or dict whose values are all of one type, from forward."
            ) from exc
        with open(path, "wb") as out:
            out.write(data)
        self.report.file = file_facts(data)


@dataclass
class ProgramResult:
    """The ExecuTorch program for the XNNPACK delegate, and the report of every step.

    ``program`` is ExecuTorch's ``ExecutorchProgramManager`` (its ``exported_program()`` is the
    lowered graph); ``buffer`` the ``.pte`` bytes; ``run`` calls the program's ``forward`` in
    ExecuTorch's runtime, with the model's own arguments and output structure.
    """

    program: Any
    buffer: bytes
    report: Report
    runner: Callable[..., Any] = field(repr=False)

    def __repr__(self) -> str:
        from fxmobile.report.render import format_bytes
        from fxmobile.report.summary import one_line

        size = format_bytes(len(self.buffer))
        return f"ProgramResult: program of {size}\n  report: {one_line(self.report)}"

    def _repr_html_(self) -> str:
        from fxmobile.report.html import report_html
        from fxmobile.report.render import format_bytes

        holds = [
            ("program", "ExecuTorch's ExecutorchProgramManager, the lowered program"),
            ("buffer", f"the .pte bytes, {format_bytes(len(self.buffer))}"),
            ("save(path)", "writes the .pte file an app loads with ExecuTorch's runtime"),
            ("run(*inputs)", "runs the program in ExecuTorch's runtime"),
        ]
        return report_html(self.report, "ProgramResult", holds)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ``.pte`` file an app loads with ExecuTorch's runtime."""
        with open(path, "wb") as out:
            out.write(self.buffer)

    def run(self, *inputs: Any) -> Any:
        """The program's outputs on ``inputs``, computed by ExecuTorch's runtime."""
        return self.runner(*inputs)


def lite_file(module: torch.jit.ScriptModule, target_runtime: str | None) -> bytes:
    """The lite-interpreter file of ``module``, backported for ``target_runtime`` if needed."""
    data = lite_interpreter_bytes(module)
    return data if target_runtime is None else backport_for(target_runtime, data)


def file_facts(data: bytes) -> FileFacts:
    """Size and mobile compatibility of a lite-interpreter file."""
    return FileFacts(len(data), file_compatibility(data).to_dict())
