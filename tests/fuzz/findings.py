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
OPEN: tuple[OpenFinding, ...] = (
    OpenFinding(
        "F2",
        ALL_STAGES,
        lambda spec: any(b.options.get("write") == "setitem" for b in spec.blocks),
        r"^AssertionError: fxmobile refused .*CaptureError: torch\.fx could not trace "
        r"FuzzModel\.forward .*'(Proxy|Attribute)' object does not support item assignment",
    ),
    OpenFinding(
        "F3",
        ALL_STAGES,
        lambda spec: any(not h.traceable for h in spec.root_hooks),
        r"^AssertionError: fxmobile refused .*CaptureError: FuzzModel has a forward "
        r"(pre-)?hook on itself \(.*\) that fxmobile cannot trace",
    ),
    OpenFinding(
        "F4",
        ("script-cpu",),
        lambda spec: spec.output_type == "dataclass",
        r"^RuntimeError: Tracer cannot infer type of (Single|Pair)Data\(",
    ),
    OpenFinding(
        "F5",
        ("script-cpu",),
        lambda spec: _traced_by_torchscript(spec) and spec.writes_in_place(),
        r"^AssertionError: optimizing wrote to example_inputs",
    ),
    OpenFinding(
        "F6",
        ("script-cpu",),
        lambda spec: _traced_by_torchscript(spec) and spec.output_type == "namedtuple",
        r"^AssertionError: fxmobile refused .*InvalidValueError: the optimized model returns a "
        r"different output structure than eager: TreeSpec\(tuple, None",
    ),
    OpenFinding(
        "F7",
        ("script-cpu",),
        lambda spec: _traced_by_torchscript(spec) and _writes_a_multi_output_view(spec),
        r"^RuntimeError: Output \d+ of \w+ is a view and is being modified inplace",
    ),
    OpenFinding(
        "F8",
        ("script-cpu",),
        lambda spec: _traced_by_torchscript(spec) and spec.writes_in_place(),
        r"^AssertionError: .* max abs error .*\nfxmobile's own check: .*first diverge after "
        r"script pass 'conv1d_to_conv2d'",
    ),
)


MULTI_OUTPUT_VIEWS = ("chunk", "torch.chunk", "split", "split_sizes", "tensor_split", "unbind",
                      "torch.unbind")  # fmt: skip


def _traced_by_torchscript(spec: ModelSpec) -> bool:
    """TorchScript cannot compile the module (a hook it keeps, a dataclass output): fxmobile
    traces it with the example inputs instead."""
    return any(b.kept_hooks for b in spec.blocks) or spec.output_type == "dataclass"


def _writes_a_multi_output_view(spec: ModelSpec) -> bool:
    return any(
        name in MULTI_OUTPUT_VIEWS
        for b in spec.blocks
        if b.kind is Kind.VIEW_WRITE
        for name, _ in b.options["views"]
    )


def open_finding(stage: str, spec: ModelSpec, failure: BaseException) -> OpenFinding | None:
    """The open finding ``failure`` is, if any."""
    return next((f for f in OPEN if f.matches(stage, spec, failure)), None)
