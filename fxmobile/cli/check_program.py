"""``fxmobile check model.pte``: the program in ExecuTorch's runtime, checked and timed.

The inputs come from the program itself (torch.export fixed their shapes and dtypes):
``torch.randn`` under ``SEED`` for float inputs, zeros for the others. The program runs twice on
them; the checks, each a row:

- ``runs``: ExecuTorch's runtime loads the program and runs ``forward``;
- ``deterministic``: the two runs give bit-identical outputs;
- ``finite``: no NaN or infinity in the outputs;
- ``matches eager``: with ``--model SPEC`` (the model the program was made from, built as
  ``optimize`` built it: same seed, same weights), the outputs against eager's within
  ``--tolerance``. Without it there is no reference, and the row says so: the other rows still
  catch a program that crashes, drifts between calls or overflows.

Then the program is timed in a clean child process (``fxmobile.cli.latency``), with eager when
``--model`` is given: median, p10 and p90 of ``--rounds`` interleaved rounds, ``--threads``
threads. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fxmobile.cli.common import TABLE_FORMATS, CliError, table
from fxmobile.cli.latency import CleanChild, InChild, Timed, measure, program_kernels
from fxmobile.cli.models import SEED, load_model
from fxmobile.errors import FxMobileError
from fxmobile.executorch.runtime import ProgramRunner
from fxmobile.options import describe_tolerance
from fxmobile.progress import phase
from fxmobile.report import OutputCheck
from fxmobile.report.render import format_bytes, numerics_table
from fxmobile.verify import compare_outputs, run_model

NO_REFERENCE = (
    "not checked: no reference; pass --model SPEC (the model the program was made from) to "
    "compare with eager"
)


@dataclass
class Check:
    """One row: what was checked, whether it held, and what was seen."""

    name: str
    passed: bool | None  # None: not checked
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.name, "passed": self.passed, "detail": self.detail}


def run(args: argparse.Namespace, path: Path) -> int:
    """Check and time the program at ``path``; 1 when a check fails."""
    console = args.console
    if args.runtime:
        raise CliError(
            f"--runtime names reference runtimes for lite-interpreter files; {path} is an "
            f"ExecuTorch program, which runs in ExecuTorch's runtime: drop --runtime"
        )
    with phase("loading the program"):
        program = ProgramRunner(str(path))
    specs = program.input_specs()
    inputs = _inputs(specs, args.input_shape, path)
    checks, outputs = _run_twice(program, inputs)
    eager_checks = None
    model = None
    if args.model and outputs is not None:
        with phase("building the model"):
            model = load_model(args.model, [tuple(x.shape) for x in inputs], args.weights).model
        with phase("checking against eager"):
            expected = _flat(run_model(model, inputs))
            # one output compares as "output"; several as flat lists (a program returns them so)
            single = len(expected) == len(outputs) == 1
            eager_checks = compare_outputs(
                expected[0] if single else expected,
                outputs[0] if single else outputs,
                args.tolerance,
            )
        worst = max((c.relative_error for c in eager_checks), default=0.0)
        passed = all(c.passed for c in eager_checks)
        detail = f"relative error {worst:.3g} (tolerance {describe_tolerance(args.tolerance)})"
        checks.append(Check("matches eager", passed, detail))
    else:
        checks.append(Check("matches eager", None, NO_REFERENCE))
    timed = None
    if outputs is not None:
        timed = _time(path, inputs, args, model)
        for warning in timed.warnings:
            console.warn(warning)
    failed = any(c.passed is False for c in checks)
    console.result(_render(path, specs, checks, eager_checks, timed, args.format))
    return 1 if failed else 0


def _render(
    path: Path,
    specs: list[tuple[tuple[int, ...], torch.dtype]],
    checks: list[Check],
    eager_checks: list[OutputCheck] | None,
    timed: Timed | None,
    fmt: str,
) -> str:
    """What ``check`` found about a program, as tables or one JSON document."""
    if fmt == "json":
        document = {
            "file": str(path),
            "file_bytes": path.stat().st_size,
            "inputs": [{"shape": list(s), "dtype": str(d)} for s, d in specs],
            "input_values": f"torch.randn (seed {SEED}) for float inputs, zeros for others",
            "checks": [c.to_dict() for c in checks],
            "eager_numerics": None if eager_checks is None else [c.to_dict() for c in eager_checks],
            "latency": None if timed is None else timed.to_dict(),
            "passed": not any(c.passed is False for c in checks),
        }
        return json.dumps(document, indent=2)
    described = ", ".join(_spec_text(shape, dtype) for shape, dtype in specs)
    head = (
        f"{path}: ExecuTorch program, {format_bytes(path.stat().st_size)}; forward takes "
        f"{described}; inputs torch.randn (seed {SEED}), zeros for non-float inputs"
    )
    rows: list[list[object]] = [[c.name, _verdict(c), c.detail] for c in checks]
    parts = [head, table(rows, ["check", "result", "detail"], fmt, numbers=False)]
    if eager_checks:
        parts.append("against eager:\n" + numerics_table(eager_checks, TABLE_FORMATS[fmt]))
    if timed is not None:
        parts.append(timed.render(fmt))
    return "\n\n".join(parts)


def _inputs(
    specs: list[tuple[tuple[int, ...], torch.dtype]],
    shapes: list[tuple[int, ...]] | None,
    path: Path,
) -> tuple[torch.Tensor, ...]:
    """Inputs of the program's own shapes; ``--input-shape`` must name those shapes."""
    if shapes and [tuple(s) for s in shapes] != [shape for shape, _ in specs]:
        wanted = " ".join("x".join(map(str, shape)) for shape, _ in specs)
        given = " ".join("x".join(map(str, s)) for s in shapes)
        raise CliError(
            f"{path} takes inputs of shape {wanted} (torch.export fixed them); --input-shape "
            f"{given} does not match: drop --input-shape, or export the model again at that shape"
        )
    generator = torch.Generator().manual_seed(SEED)
    return tuple(
        torch.randn(shape, generator=generator, dtype=dtype)
        if dtype.is_floating_point
        else torch.zeros(shape, dtype=dtype)
        for shape, dtype in specs
    )


def _run_twice(
    program: ProgramRunner, inputs: tuple[torch.Tensor, ...]
) -> tuple[list[Check], tuple[torch.Tensor, ...] | None]:
    """The runs, determinism and finiteness rows, and the first run's outputs (None if none)."""
    try:
        with phase("running the program"):
            first = _flat(run_model(program, inputs))
            second = _flat(run_model(program, inputs))
    except FxMobileError as exc:
        return [Check("runs", False, str(exc))], None
    shapes = ", ".join("x".join(map(str, t.shape)) for t in first)
    checks = [Check("runs", True, f"outputs {shapes}")]
    same = len(first) == len(second) and all(
        torch.equal(a, b) for a, b in zip(first, second, strict=True)
    )
    checks.append(
        Check("deterministic", same, "two runs, bit-identical" if same else "two runs differ")
    )
    bad = sum(int((~torch.isfinite(t)).sum()) for t in first if t.is_floating_point())
    checks.append(Check("finite", bad == 0, "no NaN or inf" if not bad else f"{bad} NaN or inf"))
    return checks, first


def _time(
    path: Path, inputs: tuple[torch.Tensor, ...], args: argparse.Namespace, model: Any
) -> Timed:
    """The program, and eager when ``model`` is given, timed in a clean child."""
    with CleanChild(args.threads) as child:
        candidates = {}
        if model is not None:
            shapes = [tuple(x.shape) for x in inputs]
            candidates["eager"] = InChild(child.eager(args.model, shapes, model), inputs, "ATen")
        candidates["ExecuTorch program"] = InChild(child.program(path), inputs, program_kernels())
        return measure(child, candidates, args.rounds)


def _flat(outputs: Any) -> tuple[torch.Tensor, ...]:
    """The tensors of an output structure, in order (a program returns them flat)."""
    return tuple(x for x in pytree.tree_leaves(outputs) if isinstance(x, torch.Tensor))


def _spec_text(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{'x'.join(map(str, shape)) or 'scalar'} {str(dtype).removeprefix('torch.')}"


def _verdict(check: Check) -> str:
    return "—" if check.passed is None else ("ok" if check.passed else "FAILED")
