"""What the docs say fxmobile does with a drawn model: optimize it, or refuse it.

A refusal is a pass only when the docs (``docs/pages``) document refusing models like this one,
decided from the spec (what the program does), never from the error: a regression that starts
refusing valid models must fail. Each ``Refusal`` names the passage that documents it, the error
class and the words its message must contain, and whether refusing is required (the model
cannot be optimized faithfully) or only allowed (fxmobile may also optimize it correctly).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import fxmobile
from tests.fuzz.spec import Kind, ModelSpec
from tests.fuzz.structure import live_values


@dataclass(frozen=True)
class Refusal:
    """A refusal the docs document for models like the drawn one."""

    name: str  # shown in the hypothesis statistics
    error: type[fxmobile.FxMobileError]
    message: str  # a regular expression the error's message must match
    readme: str  # the docs passage that documents it (docs/pages/<page>.md)
    required: bool  # False: optimizing the model correctly is fine too

    def matches(self, exc: BaseException) -> bool:
        return isinstance(exc, self.error) and re.search(self.message, str(exc)) is not None


GLOBAL_HOOKS = Refusal(
    "torch's global module hooks",
    fxmobile.CaptureError,
    r"global module hooks are registered",
    "capture.md, Hooks: torch's *global* module hooks (register_module_forward_hook and its "
    "pre-hook twin) are refused with a CaptureError",
    required=True,
)
FILLS_A_CACHE = Refusal(
    "forward fills a cache",
    fxmobile.CaptureError,
    r"changes the module's state while it runs",
    "bad-input.md: forward changes a buffer, parameter or attribute (self.n.add_(1), "
    "self.cache.append), optimize_fx: CaptureError",
    required=False,
)


ROOT_HOOK = Refusal(
    "a hook on the model itself that cannot be traced",
    fxmobile.CaptureError,
    r"FuzzModel\w* has a forward (pre-)?hook on itself \(.*\) that fxmobile cannot trace.*Fix:",
    "capture.md, Hooks: a hook on the model itself that is not a plain pure function is refused "
    "(bad-input.md: CaptureError ... Fix: register it on a submodule)",
    required=True,
)
DATACLASS_OUTPUT = Refusal(
    "a dataclass output on a traced TorchScript module",
    fxmobile.FxMobileError,
    r"returns a dataclass \((Single|Pair)Data\).*Fix: return a tuple, dict or NamedTuple",
    "bad-input.md: a dataclass output, through optimize, when TorchScript cannot compile the "
    "model (so it is traced): ScriptingError",
    required=False,
)


SUBCLASSED_BATCHNORM = Refusal(
    "subclassed BatchNorm: control flow on its input",
    fxmobile.CaptureError,
    r"could not trace submodule .*\(MyBatchNorm\dd\).*control flow",
    "bad-input.md: untraceable control flow: CaptureError ... mark it as a leaf (BatchNorm's "
    "forward checks its input's rank with `if input.dim() != 4`: torch.fx cannot trace that "
    "once a subclass makes it traced code instead of a leaf call)",
    required=False,
)

DATA_WRITE_TRACED = Refusal(
    "a write through .data on the tracing route",
    fxmobile.FxMobileError,
    r"its torch\.jit\.trace computes something else than (forward|the optimized graph) on "
    r"the example inputs",
    "bad-input.md: a write through `.data` in a module that would be traced (neither torch.fx "
    "nor TorchScript captures the model, or the optimized graph does not script): "
    "ScriptingError",
    required=False,
)


SEED_CALL = Refusal(
    "a seed call in forward",
    fxmobile.RefusedError,
    r"FuzzModel\w*\.forward calls torch\.manual_seed at .*Fix: seed once before calling the model",
    "fxmobile/capture/random_calls.py (docs/pages/bad-input.md): a "
    "seed call in forward (torch.manual_seed, torch.seed, torch.set_rng_state) is refused with "
    "a RefusedError on every route, whatever check says",
    required=True,
)
UNUSED_DRAW = Refusal(
    "a random draw whose result nothing reads, through TorchScript (fuzz finding F14)",
    fxmobile.RefusedError,
    r"FuzzModel\w*\.forward draws random numbers it never uses \(torch\.\w+\).*Fix",
    "bad-input.md: forward draws random numbers it never uses, on a route through TorchScript "
    "(which drops the draw): RefusedError, whatever check says",
    required=False,
)
GENERATOR = Refusal(
    "a torch.Generator of forward's own",
    fxmobile.RefusedError,
    r"FuzzModel\w*\.forward passes a torch\.Generator to torch\.randn at .*Fix",
    "fxmobile/capture/random_calls.py (docs/pages/bad-input.md): a "
    "generator= argument in forward is refused with a RefusedError",
    required=True,
)
TOP_LEVEL_BRANCH = Refusal(
    "control flow in the model's own forward",
    fxmobile.CaptureError,
    r"torch\.fx could not trace FuzzModel\w*\.forward .*auto_leaf cannot help: the failure is in "
    r"the top-level forward itself",
    "bad-input.md: untraceable control flow: CaptureError (in the top-level forward no leaf can "
    "take it: fxmobile.optimize falls back to TorchScript)",
    required=False,
)
TRACE_DIFFERS = Refusal(
    "a trace that computes something else (control flow on the layout)",
    fxmobile.ScriptingError,
    r"its torch\.jit\.trace computes something else than (forward|the optimized graph) on",
    "bad-input.md / capture.md: a model only torch.jit.trace takes, whose trace computes "
    "something else than forward on the example inputs in another memory layout (a branch on "
    "x.is_contiguous()): ScriptingError",
    required=False,
)
STATE_ON_THE_TRACE = Refusal(
    "state changed on every call, through the traced route",
    fxmobile.NumericalMismatchError,
    r"does not match eager",
    "bad-input.md: forward changes a buffer, parameter or attribute, through optimize, where "
    "the traced module does not compute what eager does call after call: "
    "NumericalMismatchError",
    required=False,
)


def refused_by_the_gate(stage: str, spec: ModelSpec, gate_warning: str | None) -> Refusal | None:
    """The documented refusal fxmobile's gate made (with ``check="raise"``, the default, no
    module would have come back), if the gate warned on a model the docs say it may refuse."""
    if gate_warning is None:
        return None
    found = []
    if stage == "script-cpu" and any(b.kind is Kind.COUNTER for b in spec.blocks):
        found.append(STATE_ON_THE_TRACE)
    message = f"fxmobile's optimized FuzzModel {gate_warning}"
    return next((r for r in found if re.search(r.message, message, re.DOTALL)), None)


def documented_refusals(spec: ModelSpec, stage: str) -> list[Refusal]:
    """The refusals the docs document for ``spec``'s model through ``stage`` (a
    ``tests.fuzz.check.Stage`` value; none: it must be optimized).

    - torch's global module hooks registered while optimizing: refused, always;
    - a hook on the model itself that is not a plain pure function: refused, always;
    - a dataclass output through ``optimize``: TorchScript cannot compile it, and a traced
      module cannot return it;
    - a subclass of a BatchNorm overriding ``forward``: torch.fx traces into it, and
      BatchNorm's ``forward`` branches on its input's rank (untraceable control flow);
    - a cache that ``forward`` fills: an empty one (the model has not run yet) is filled by the
      first call, and LeViT's, keyed by ``str(x.device)``, gets a new key when traced (the
      device of a traced value is no device): bad-input.md's "forward changes a buffer,
      parameter or attribute" refusal. A dict cache already filled is only read: that model
      must be optimized;
    - a write through ``.data`` in such a model, or in one whose hooks stay with their modules
      (the optimized graph may not script), through ``optimize``: the route left is
      torch.jit.trace, which does not record that write, so the trace is refused;
    - a seed call, or a generator of forward's own: refused, always;
    - a call counter (state written on every call) through the FX stages: "forward changes a
      buffer"; through ``optimize`` it takes the traced route;
    - control flow in the model's own forward: torch.fx cannot take it (shape-aware tracing
      answers a branch on a dtype or a shape), and through ``optimize`` the trace must replay
      forward in other layouts: a branch on ``is_contiguous()`` may not.
    """
    found = []
    if spec.global_hook:
        found.append(GLOBAL_HOOKS)
    if any(not h.traceable for h in spec.root_hooks):
        found.append(ROOT_HOOK)
    if spec.output_type == "dataclass" and stage == "script-cpu":
        found.append(DATACLASS_OUTPUT)
    if any(b.kind is Kind.BATCHNORM and b.options.get("subclass") for b in spec.blocks):
        found.append(SUBCLASSED_BATCHNORM)
    caches = [b for b in spec.blocks if b.kind is Kind.CACHE]
    counted = any(b.kind is Kind.COUNTER for b in spec.blocks)
    fills = bool(caches) and (
        spec.cold_cache or any(b.options["pattern"] == "levit" for b in caches)
    )
    if fills or (counted and stage != "script-cpu"):
        found.append(FILLS_A_CACHE)
    calls = {b.options["call"] for b in spec.blocks if b.kind is Kind.RANDOM}
    if "seed" in calls:
        found.append(SEED_CALL)
    if "generator" in calls:
        found.append(GENERATOR)
    live = live_values(spec)
    dead_draw = any(b.kind is Kind.RANDOM and i + 1 not in live for i, b in enumerate(spec.blocks))
    if stage == "script-cpu" and dead_draw:
        found.append(UNUSED_DRAW)
    inline = [b for b in spec.blocks if b.kind is Kind.BRANCH and b.form == "inline"]
    if inline and stage != "script-cpu":
        found.append(TOP_LEVEL_BRANCH)
    traced = counted or FILLS_A_CACHE in found or bool(inline)
    if stage == "script-cpu" and traced and any(b.options["on"] == "layout" for b in inline):
        found.append(TRACE_DIFFERS)
    data_write = any(
        b.kind is Kind.VIEW_WRITE and any(v[0] == "data" for v in b.options.get("views", ()))
        for b in spec.blocks
    )
    kept = any(b.kept_hooks for b in spec.blocks)
    if data_write and stage == "script-cpu" and (FILLS_A_CACHE in found or kept):
        # the cache sends the model to torch.jit.trace; a hook TorchScript cannot compile, on a
        # module that cannot be traced alone, sends the optimized graph there
        found.append(DATA_WRITE_TRACED)
    return found


def gate_may_fire(noise: list[float], scales: list[float], tolerances: list[float]) -> bool:
    """Whether fxmobile's own check (the gate: optimized against eager, within each output's
    tolerance, by its dtype, of its scale) may fail a correct optimization of this model.

    A correct result lies within 4x the rounding noise of the float64 anchor (the oracle's
    bound), and eager within 1x, so they differ by at most 5x the noise: when that stays below
    the tolerance for every output, the gate has no reason to fire. Past it (a BatchNorm on the
    batch statistics of near-constant values amplifies rounding), the gate's page documents
    the refusal: the outputs do differ beyond the tolerance.
    """
    return any(5 * n >= t * s for n, s, t in zip(noise, scales, tolerances, strict=True))
