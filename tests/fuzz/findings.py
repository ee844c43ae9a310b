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

from tests.fuzz.spec import Kind, ModelSpec


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
# F2-F9 are fixed, each guarded by its test_regression_* (F1 is a note).
OPEN: tuple[OpenFinding, ...] = (
    OpenFinding(
        "F10",
        ("script-cpu",),
        lambda spec: _has_hooks(spec) and any(b.kind is Kind.CACHE for b in spec.blocks),
        r"^AssertionError: hooked modules traced \(True\) or kept \(False\): the report says "
        r"\{\}",
    ),
    OpenFinding(
        "F11",
        ("script-cpu",),
        lambda spec: (
            any(b.kind is Kind.CACHE for b in spec.blocks)
            and any(b.options.get("alias") for b in spec.blocks)
        ),
        r"^AssertionError: fxmobile refused .*ScriptingError: torch\.jit\.trace could not trace "
        r".*TracedModules don't support parameter sharing between modules",
    ),
)


def _has_hooks(spec: ModelSpec) -> bool:
    """Hooks on the model or its layers (a cache's state change sends the model to capture's
    TorchScript fallback, whose report lists no hooks: F10)."""
    return bool(spec.root_hooks) or any(b.hooks for b in spec.blocks)


def open_finding(stage: str, spec: ModelSpec, failure: BaseException) -> OpenFinding | None:
    """The open finding ``failure`` is, if any."""
    return next((f for f in OPEN if f.matches(stage, spec, failure)), None)
