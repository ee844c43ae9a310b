"""Bugs the fuzzer found that fxmobile has not fixed yet: recognised, counted, not failed on.

Each open finding is in ``/work/notes/fuzz-findings.md`` (for the lead) and has a strict
``xfail`` reproducer in ``tests/test_fuzz_regressions.py``. Until its fix lands the property
test would fail on every model that has it; so a failure that matches an open finding exactly
(the stage, a property of the drawn program, and the failure's own words) is counted as a
hypothesis event (``open finding: F<n>``) instead. Any other failure on the same model still
fails. When the fix lands, the reproducer XPASSes (strict), and the entry here goes with it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tests.fuzz.spec import ModelSpec


@dataclass(frozen=True)
class OpenFinding:
    name: str  # "F2", as in the findings file
    stages: tuple[str, ...]  # Stage values it shows on
    applies: Callable[[ModelSpec], bool]  # the program has the idiom that triggers it
    signature: str  # a regular expression the failure ("ErrorType: message") matches

    def matches(self, stage: str, spec: ModelSpec, failure: BaseException) -> bool:
        text = f"{type(failure).__name__}: {failure}"
        return (
            stage in self.stages
            and self.applies(spec)
            and re.search(self.signature, text, re.DOTALL) is not None
        )


ALL_STAGES = ("fx", "fx-channels-last", "script-cpu")
# F2-F14 are fixed, each guarded by its test_regression_* (F1 is a note).
OPEN: tuple[OpenFinding, ...] = ()


def open_finding(stage: str, spec: ModelSpec, failure: BaseException) -> OpenFinding | None:
    """The open finding ``failure`` is, if any."""
    return next((f for f in OPEN if f.matches(stage, spec, failure)), None)
