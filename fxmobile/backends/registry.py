"""The backends fxmobile can target, and what each one runs.

A ``Backend`` is selected by member; strings are accepted case-insensitively for drop-in
compatibility with ``torch.utils.mobile_optimizer.optimize_for_mobile`` and refused with
upstream's own message when unknown. Each backend's pipeline lives in its own folder and is
imported only when that backend is used.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fxmobile.backends.library import OpFamily
from fxmobile.errors import InvalidArgumentError
from fxmobile.options import MobileOptimizerType

UNKNOWN_BACKEND = "Unknown backend, must be one of 'CPU', 'Vulkan' or 'Metal'"


class Backend(enum.Enum):
    CPU = "cpu"
    VULKAN = "vulkan"
    METAL = "metal"

    @classmethod
    def parse(cls, value: Backend | str) -> Backend:
        if isinstance(value, Backend):
            return value
        if isinstance(value, str):
            for member in cls:
                if member.value == value.lower():
                    return member
        raise InvalidArgumentError(f"{UNKNOWN_BACKEND} (got {value!r})")


@dataclass(frozen=True)
class BackendSpec:
    """What a backend runs: its op family, pass list and the attributes it marks modules with."""

    op_family: OpFamily
    passes: Callable[[], tuple[Any, ...]]
    markers: dict[str, bool]
    # The blocklist members this backend honours (upstream: Vulkan only reads its GPU transfer;
    # Metal takes no blocklist); None means all of them.
    honours: frozenset[MobileOptimizerType] | None = None


_MODULES = {
    Backend.CPU: ("fxmobile.backends.xnnpack.pipeline", OpFamily.XNNPACK),
    Backend.VULKAN: ("fxmobile.backends.vulkan.pipeline", OpFamily.VULKAN),
    Backend.METAL: ("fxmobile.backends.metal.pipeline", OpFamily.METAL),
}


def backend_spec(backend: Backend) -> BackendSpec:
    module_name, family = _MODULES[backend]
    module = importlib.import_module(module_name)
    return BackendSpec(
        op_family=family,
        passes=module.passes,
        markers=dict(module.MARKERS),
        honours=getattr(module, "HONOURS", None),
    )
