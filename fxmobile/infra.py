"""The pass contract both stages share: a ``Pass`` returns a ``PassResult``; a manager runs them.

A pass rewrites one *unit* (an ``fx.GraphModule`` in the FX stage, a ``torch.jit.ScriptModule``
in the TorchScript stage) and says how many rewrites it made and, for each reason it declined a
candidate, how many times (``{"conv output has 2 users": 3}``). ``modified`` is derived from the
count, so no pass can claim a change it did not make.

A pass's ``name`` is its file's name (``fold_batchnorm`` lives in ``fold_batchnorm.py``), and its
``optimization`` is the blocklist member that switches it off (None: it always runs); the report
shows both. The ``PassManager`` skips blocklisted passes, lets the stage prepare the unit
(shapes), runs the pass, lets the stage re-check and tidy the result (lint, recompile), measures
and records it, and when a pass raises, names the pass and the passes that ran before it.
"""

from __future__ import annotations

import abc
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Generic, Protocol, TypeVar

from fxmobile.errors import PassError
from fxmobile.options import MobileOptimizerType
from fxmobile.progress import step
from fxmobile.report.records import PassRecord, Stage, Status

U = TypeVar("U")  # the unit a stage rewrites
C = TypeVar("C")  # what every pass of a stage needs to know besides the unit


@dataclass(frozen=True)
class PassResult(Generic[U]):
    """What one pass did to one unit."""

    unit: U
    rewrites: int
    skips: Mapping[str, int] = field(default_factory=dict)

    @property
    def modified(self) -> bool:
        """Whether the pass rewrote anything (derived from the count)."""
        return self.rewrites > 0


class Skips(Counter[str]):
    """Counts the reasons a pass gave up on a candidate, in the order first seen."""

    def add(self, reason: str) -> None:
        """Count one more candidate declined for ``reason``."""
        self[reason] += 1


class Pass(abc.ABC, Generic[U, C]):
    """A rewrite of one unit; subclasses set ``optimization`` and ``summary``, implement ``call``.

    ``summary`` is the one-line rewrite (``before -> after``) that ``fxmobile passes`` prints and
    the docs' pass tables show (docs/pages/passes.md).
    """

    optimization: MobileOptimizerType | None = None
    summary: ClassVar[str]

    @property
    def name(self) -> str:
        """The pass's file name: ``fxmobile.passes.fold_batchnorm`` -> ``fold_batchnorm``."""
        return type(self).__module__.rsplit(".", 1)[-1]

    def blocked_by(self) -> frozenset[MobileOptimizerType]:
        """The blocklist members that switch this pass off (its own member, if any)."""
        return frozenset({self.optimization}) if self.optimization else frozenset()

    @abc.abstractmethod
    def call(self, unit: U, ctx: C) -> PassResult[U]:
        """Rewrite ``unit`` (fxmobile's own copy) and say what changed and why not more."""


class StageAdapter(Protocol[U, C]):
    """What differs between the stages around each pass: preparing, re-checking, measuring."""

    stage: Stage

    def before(self, p: Pass[U, C], unit: U) -> None:
        """Make ``unit`` ready for ``p`` (the FX stage refreshes shapes for the passes that
        read them)."""

    def after(self, p: Pass[U, C], result: PassResult[U]) -> U:
        """Re-check and tidy ``p``'s result (lint, recompile); the unit to carry on with."""

    def measure(self, unit: U) -> tuple[int, int]:
        """(nodes, tensor bytes) of ``unit``, for the report's before/after columns."""


# Called after each pass that ran with its name and the unit as it left the pass; used to find
# the first pass after which the outputs diverge from eager (fxmobile.verify).
Observer = Callable[[str, object], None]


class PassManager(Generic[U, C]):
    """Runs ``passes`` in order on a unit, recording each one for the report."""

    def __init__(
        self,
        passes: Sequence[Pass[U, C]],
        stage: StageAdapter[U, C],
        ctx: C,
        blocklist: frozenset[MobileOptimizerType] = frozenset(),
        observer: Observer | None = None,
    ) -> None:
        self.passes = tuple(passes)
        self.stage = stage
        self.ctx = ctx
        self.blocklist = blocklist
        self.observer = observer

    def run(self, unit: U) -> tuple[U, list[PassRecord]]:
        """Apply every pass that is not blocklisted; the final unit and one record per pass."""
        records: list[PassRecord] = []
        measured: tuple[int, int] | None = None  # the last pass's "after" is the next "before"
        stage = self.stage.stage
        for done, p in enumerate(self.passes):
            step(f"{stage.value} passes", done, len(self.passes))
            member = p.optimization.name if p.optimization else None
            if p.blocked_by() & self.blocklist:
                records.append(PassRecord(p.name, stage, Status.BLOCKLISTED, member=member))
                continue
            nodes_before, bytes_before = measured or self.stage.measure(unit)
            start = time.perf_counter()
            try:
                self.stage.before(p, unit)
                result = p.call(unit, self.ctx)
                unit = self.stage.after(p, result)
            except Exception as exc:
                raise _failure(stage, p, records, exc) from exc
            seconds = time.perf_counter() - start
            measured = self.stage.measure(unit)
            records.append(
                PassRecord(
                    name=p.name,
                    stage=stage,
                    status=Status.RAN,
                    member=member,
                    rewrites=result.rewrites,
                    skips=dict(result.skips),
                    nodes_before=nodes_before,
                    nodes_after=measured[0],
                    param_bytes_before=bytes_before,
                    param_bytes_after=measured[1],
                    seconds=seconds,
                )
            )
            if self.observer is not None:
                self.observer(p.name, unit)
        return unit, records


def _failure(stage: Stage, p: Pass[U, C], records: list[PassRecord], exc: Exception) -> PassError:
    ran = ", ".join(r.name for r in records if r.status is Status.RAN) or "none"
    member = f"MobileOptimizerType.{p.optimization.name}" if p.optimization else None
    skip = f"Blocklist {member} to skip it, and please" if member else "Please"
    return PassError(
        f"fxmobile {stage.value} pass {p.name!r} failed: {type(exc).__name__}: {exc}. "
        f"Passes that ran before it: {ran}. {skip} report the model."
    )
