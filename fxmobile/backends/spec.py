"""``BackendSpec``: what one backend's TorchScript stage runs, as data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fxmobile.backends.library import OpFamily
from fxmobile.options import MobileOptimizerType
from fxmobile.script.stage import ScriptPass


@dataclass(frozen=True)
class BackendSpec:
    """A backend: its op family, its pass list, and the attributes it marks modules with."""

    op_family: OpFamily
    passes: Callable[[], tuple[ScriptPass, ...]]  # fresh pass instances, in order
    markers: dict[str, bool]
    # The blocklist members this backend honours (upstream: Vulkan only reads its GPU transfer;
    # Metal takes no blocklist); None means all of them.
    honours: frozenset[MobileOptimizerType] | None = None
