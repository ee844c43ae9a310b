"""The default order of the FX passes: one tuple, in one place."""

from __future__ import annotations

from fxmobile.passes.eliminate_dead_code import EliminateDeadCode
from fxmobile.passes.infra import FxPass
from fxmobile.passes.remove_dropout import RemoveDropout
from fxmobile.passes.remove_identity import RemoveIdentity

DEFAULT_FX_PASSES: tuple[type[FxPass], ...] = (
    RemoveDropout,
    RemoveIdentity,
    EliminateDeadCode,
)


def fx_pipeline(*, channels_last: bool = False) -> tuple[FxPass, ...]:
    """Fresh instances of the default passes, plus the opt-in ones asked for."""
    passes: list[FxPass] = [cls() for cls in DEFAULT_FX_PASSES]
    return tuple(passes)
