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
from tests.fuzz.spec import ModelSpec


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


def documented_refusals(spec: ModelSpec) -> list[Refusal]:
    """The refusals the README documents for ``spec``'s model (none: it must be optimized)."""
    return []


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
