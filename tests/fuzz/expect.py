"""What the README says fxmobile does with a drawn model: optimize it, or refuse it.

A refusal is a pass only when the README documents refusing models like this one, decided from
the spec (what the program does), never from the error: a regression that starts refusing
valid models must fail. Each ``Refusal`` names the README passage that documents it, the error
class and the words its message must contain, and whether refusing is required (the model
cannot be optimized faithfully) or only allowed (fxmobile may also optimize it correctly).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import fxmobile
from tests.fuzz.spec import Kind, ModelSpec


@dataclass(frozen=True)
class Refusal:
    """A refusal the README documents for models like the drawn one."""

    name: str  # shown in the hypothesis statistics
    error: type[fxmobile.FxMobileError]
    message: str  # a regular expression the error's message must match
    readme: str  # the README passage that documents it
    required: bool  # False: optimizing the model correctly is fine too

    def matches(self, exc: BaseException) -> bool:
        return isinstance(exc, self.error) and re.search(self.message, str(exc)) is not None


GLOBAL_HOOKS = Refusal(
    "torch's global module hooks",
    fxmobile.CaptureError,
    r"global module hooks are registered",
    "Hooks: torch's *global* module hooks (register_module_forward_hook and its pre-hook twin) "
    "are refused with a CaptureError",
    required=True,
)
FILLS_A_CACHE = Refusal(
    "forward fills a cache",
    fxmobile.CaptureError,
    r"changes the module's state while it runs",
    "Bad input: forward changes a buffer, parameter or attribute (self.cache.append): CaptureError",
    required=False,
)


ROOT_HOOK = Refusal(
    "a hook on the model itself that cannot be traced",
    fxmobile.CaptureError,
    r"FuzzModel has a forward (pre-)?hook on itself \(.*\) that fxmobile cannot trace.*Fix:",
    "Hooks: a hook on the model itself that is not a plain pure function is refused "
    "(Bad input: CaptureError ... Fix: register it on a submodule)",
    required=True,
)
DATACLASS_OUTPUT = Refusal(
    "a dataclass output on a traced TorchScript module",
    fxmobile.FxMobileError,
    r"returns a dataclass \((Single|Pair)Data\).*Fix: return a tuple, dict or NamedTuple",
    "Bad input: a dataclass output, through optimize, when TorchScript cannot compile the model "
    "(so it is traced): ScriptingError",
    required=False,
)


SUBCLASSED_BATCHNORM = Refusal(
    "subclassed BatchNorm: control flow on its input",
    fxmobile.CaptureError,
    r"could not trace submodule .*\(MyBatchNorm\dd\).*control flow",
    "Bad input: untraceable control flow: CaptureError ... mark it as a leaf (BatchNorm's "
    "forward checks its input's rank with `if input.dim() != 4`: torch.fx cannot trace that "
    "once a subclass makes it traced code instead of a leaf call)",
    required=False,
)

DATA_WRITE_TRACED = Refusal(
    "a write through .data on the tracing route",
    fxmobile.FxMobileError,
    r"its torch\.jit\.trace computes something else than (forward|the optimized graph) on "
    r"the example inputs",
    "Bad input: a write through `.data` in a module that would be traced (neither torch.fx nor "
    "TorchScript captures the model, or the optimized graph does not script): ScriptingError",
    required=False,
)


def documented_refusals(spec: ModelSpec, stage: str) -> list[Refusal]:
    """The refusals the README documents for ``spec``'s model through ``stage`` (a
    ``tests.fuzz.check.Stage`` value; none: it must be optimized).

    - torch's global module hooks registered while optimizing: refused, always;
    - a hook on the model itself that is not a plain pure function: refused, always;
    - a dataclass output through ``optimize``: TorchScript cannot compile it, and a traced
      module cannot return it;
    - a subclass of a BatchNorm overriding ``forward``: torch.fx traces into it, and
      BatchNorm's ``forward`` branches on its input's rank (untraceable control flow);
    - a cache that ``forward`` fills: an empty one (the model has not run yet) is filled by the
      first call, and LeViT's, keyed by ``str(x.device)``, gets a new key when traced (the
      device of a traced value is no device): the README's "forward changes an attribute"
      refusal. A dict cache already filled is only read: that model must be optimized;
    - a write through ``.data`` in such a model, or in one whose hooks stay with their modules
      (the optimized graph may not script), through ``optimize``: the route left is
      torch.jit.trace, which does not record that write, so the trace is refused.
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
    if caches and (spec.cold_cache or any(b.options["pattern"] == "levit" for b in caches)):
        found.append(FILLS_A_CACHE)
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


def gate_may_fire(noise: list[float], scales: list[float], tolerance: float) -> bool:
    """Whether fxmobile's own check (the gate: optimized against eager, within ``tolerance``
    of each output's scale) may fail a correct optimization of this model.

    A correct result lies within 4x the rounding noise of the float64 anchor (the oracle's
    bound), and eager within 1x, so they differ by at most 5x the noise: when that stays below
    the tolerance for every output, the gate has no reason to fire. Past it (a BatchNorm on the
    batch statistics of near-constant values amplifies rounding), the README's gate documents
    the refusal: the outputs do differ beyond the tolerance.
    """
    return any(5 * n >= tolerance * s for n, s in zip(noise, scales, strict=True))
