"""``--latency`` and ``check model.pte``: candidates timed in a clean child process.

Timing in the command's own process measured whatever state it was left in, with OpenMP's
threads spinning by default: on a 2-core machine shared with other jobs, mobilenet_v2's eager
median came out at 1,445 ms (p10 74 ms) and a 15.9x speed-up that was not there. So the
candidates run in a fresh child of the same python (``latency_server.py``, started by
``RuntimeProcess``, the protocol the reference runtimes use): ``OMP_WAIT_POLICY=PASSIVE``
unless the environment sets it, ``--threads`` threads (torch's, OpenMP's and ExecuTorch's
XNNPACK pool), nothing else loaded. Each candidate times its own calls there
(``compare_latency``: interleaved rounds, fresh random order each round), so the pipe is not
in the figures.

A run is flagged busy when some candidate's p90 is more than ``BUSY_SPREAD`` times its p10:
the spread of one candidate's own calls then exceeds the differences the table is read for.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fxmobile.cli import latency_server
from fxmobile.cli.common import TABLE_FORMATS
from fxmobile.cli.models import absolute_spec
from fxmobile.progress import phase
from fxmobile.runtime.latency import Candidate, Latency, compare_latency, latency_table
from fxmobile.runtime.process import LoadedFile, RuntimeProcess
from fxmobile.timing import Timing

SERVER = Path(latency_server.__file__).resolve()
# p90/p10 above which the timings are flagged. Quiet runs of the README's mobilenet_v2 table gave
# 1.15-1.31 (interleaved, 2 threads); a busy machine gave 2 to 20. 1.5 sits above every quiet
# spread seen and below every busy one, and at 1.5 a candidate's own noise spans half its median:
# more than the difference between the candidates the speed-up column compares.
BUSY_SPREAD = 1.5
TORCH = torch.__version__.split("+")[0]
RUNS_ON = f"torch {TORCH}, clean child process"


class InChild:
    """A file, model or program loaded in the child, timed there on ``inputs`` (a Candidate)."""

    def __init__(self, loaded: LoadedFile, inputs: Sequence[Any], kernels: str) -> None:
        self.loaded = loaded
        self.inputs = tuple(inputs)
        self.kernels = kernels
        self.runs_on = RUNS_ON

    def time(self, n: int) -> list[float]:
        return self.loaded.time(n, *self.inputs)


@dataclass
class Timed:
    """The candidates' latency, how it was measured, and whether the machine was busy."""

    latency: dict[str, Latency]
    rounds: int
    threads: int
    wait_policy: str
    warnings: list[str] = field(default_factory=list)

    def render(self, fmt: str) -> str:
        """The latency table (speed-ups against the first candidate) and how it was measured."""
        threads = f"{self.threads} thread" + ("s" if self.threads != 1 else "")
        caption = (
            f"({self.rounds} rounds, candidates interleaved in random order, in a clean child "
            f"process: {threads}, OMP_WAIT_POLICY={self.wait_policy})"
        )
        return latency_table(self.latency, tablefmt=TABLE_FORMATS[fmt]) + "\n" + caption

    def timings(self) -> dict[str, Timing]:
        """Each candidate's timing, per-call samples included: what ``Report.latency`` holds."""
        return {name: t.timing for name, t in self.latency.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidates": {
                name: {**t.to_dict(), "samples_ms": list(t.timing.samples_ms)}
                for name, t in self.latency.items()
            },
            "rounds": self.rounds,
            "threads": self.threads,
            "omp_wait_policy": self.wait_policy,
            "where": "clean child process",
            "warnings": self.warnings,
        }


class CleanChild:
    """The child process the candidates load into; ``close()`` (or ``with``) stops it."""

    def __init__(self, threads: int) -> None:
        with phase("starting a clean child process"):
            self.process = RuntimeProcess(
                f"{TORCH} (clean child)",
                threads=threads,
                python=Path(sys.executable),
                script=SERVER,
            )
        self.threads = self.process.info.threads
        self.wait_policy = self.process.info.omp_wait_policy or "unset"

    def eager(
        self, spec: str, shapes: Sequence[tuple[int, ...]] | None, model: nn.Module
    ) -> LoadedFile:
        """The model ``spec`` names, built there as here, with ``model``'s weights."""
        with _state_file(model) as state, phase("loading the model into the child"):
            reply = self.process.call(
                "load_model",
                spec=absolute_spec(spec),
                shapes=[list(s) for s in shapes] if shapes else None,
                state=state,
                sys_path=list(sys.path),
            )
        return LoadedFile(self.process, reply["handle"], spec, "eager")

    def file(self, path: Path, kind: str) -> LoadedFile:
        """A saved file there: ``lite`` (the lite interpreter) or ``script`` (torch.jit.load)."""
        with phase("loading the file into the child"):
            return self.process.load(path, kind=kind)

    def program(self, path: Path) -> LoadedFile:
        """A ``.pte`` there, in ExecuTorch's runtime, on a pool of the child's threads."""
        with phase("loading the program into the child"):
            reply = self.process.call("load_program", path=str(Path(path).resolve()))
        self.threads = int(reply["threads"])
        return LoadedFile(self.process, reply["handle"], str(path), "program")

    def close(self) -> None:
        self.process.close()

    def __enter__(self) -> CleanChild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure(child: CleanChild, candidates: Mapping[str, Candidate], rounds: int) -> Timed:
    """``rounds`` interleaved rounds of every candidate (the first is the speed-ups' base)."""
    found = compare_latency(candidates, rounds=rounds)
    return Timed(found, rounds, child.threads, child.wait_policy, busy(found))


def busy(found: dict[str, Latency]) -> list[str]:
    """A warning when some candidate's p90 is over ``BUSY_SPREAD`` times its p10."""
    spreads = {
        name: t.timing.p90_ms / t.timing.p10_ms
        for name, t in found.items()
        if t.timing.p10_ms > 0 and t.timing.p90_ms / t.timing.p10_ms > BUSY_SPREAD
    }
    if not spreads:
        return []
    listed = ", ".join(f"{spread:.1f}x for {name}" for name, spread in spreads.items())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    where = f" (load average {load:.1f} on {os.cpu_count()} cores)" if load is not None else ""
    return [
        f"the machine was busy while timing{where}: p90/p10 is {listed}, above "
        f"{BUSY_SPREAD}x (quiet runs stay under it); the medians and speed-ups are not "
        f"reliable: time again when the machine is quiet"
    ]


def program_kernels() -> str:
    """What a ``.pte`` runs on, for its latency row."""
    try:
        version = metadata.version("executorch")
    except metadata.PackageNotFoundError:
        version = "?"
    return f"ExecuTorch {version}: XNNPACK delegate + portable kernels"


@contextmanager
def _state_file(model: nn.Module) -> Iterator[str | None]:
    """``model``'s state dict in a temporary file (None for a ScriptModule's, which the child
    does not need: it loads the file itself)."""
    if isinstance(model, torch.jit.ScriptModule):
        yield None
        return
    handle, path = tempfile.mkstemp(prefix="fxmobile-state-", suffix=".pt")
    os.close(handle)
    try:
        torch.save(model.state_dict(), path)
        yield path
    finally:
        os.unlink(path)
