"""Loader for fxmobile's operator library, ``fxmobile._C``: registers the op families.

Why: PyTorch 2.13+ ships without XNNPACK, Vulkan and Metal, so the ``prepacked::``,
``vulkan_prepack::`` and ``metal_prepack::`` operators and their ``xnnpack.*``, ``vulkan.*``,
``metal.*`` context classes that mobile-optimized TorchScript names do not exist. ``fxmobile._C``
registers them (upstream names, schemas and pickled state, with CPU kernels) so such graphs can
be built, saved, loaded and run here, and still load unchanged on mobile runtimes.

What: :func:`ensure_registered` registers one :class:`OpFamily` the first time it is asked,
unless the running torch already provides that family (then torch's own ops are used and
nothing is registered); it answers who provides the family. Calls are idempotent and
serialized by a lock. Importing this module (so ``import fxmobile``) registers every family
(about 2 ms), so that ``torch.jit.load`` and the lite interpreter can read an fxmobile file in
a fresh process with nothing else called first. A failure there (``fxmobile._C`` not built, or
built for another torch) does not fail the import: the error is raised, with how to fix it,
when a family is needed (:func:`ensure_registered`, or loading a file that names its ops).
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import threading
from types import ModuleType

import torch

from fxmobile.errors import FxMobileError, InvalidArgumentError

__all__ = [
    "ExtensionUnavailableError",
    "OpFamily",
    "Provider",
    "ensure_registered",
    "registration_status",
]


class OpFamily(enum.Enum):
    """A set of prepacked operators and context classes one mobile backend uses."""

    XNNPACK = "xnnpack"  # prepacked::*, xnnpack.*OpContext
    VULKAN = "vulkan"  # vulkan_prepack::create_*/run_*_context, vulkan.*PackedContext
    METAL = "metal"  # metal_prepack::*, metal.*OpContext


class Provider(enum.Enum):
    """Who registered an op family in this process."""

    NATIVE = "native"  # the running torch was built with the backend
    FXMOBILE = "fxmobile"  # fxmobile._C registered it


class ExtensionUnavailableError(FxMobileError, RuntimeError):
    """``fxmobile._C`` is missing or cannot be loaded into the running torch."""


# One operator per family that every torch built with that backend registers.
_SENTINEL_OPS = {
    OpFamily.XNNPACK: "prepacked::linear_clamp_run",
    OpFamily.VULKAN: "vulkan_prepack::run_conv2d_context",
    OpFamily.METAL: "metal_prepack::conv2d_run",
}

_lock = threading.Lock()
_status: dict[OpFamily, Provider] = {}
_extension: ModuleType | None = None
_BUILD_HINT = (
    "Build it with `make install` from the fxmobile checkout (or "
    "`pip install --no-build-isolation -e .` in the environment that has torch "
    f"{torch.__version__}); building needs a C++ compiler (g++ or clang++)."
)


def ensure_registered(family: OpFamily) -> Provider:
    """Makes ``family``'s operators and classes available; returns who provides them.

    Uses torch's own registration when the running torch has the family, otherwise loads
    ``fxmobile._C`` and registers fxmobile's. Raises :class:`ExtensionUnavailableError`,
    saying how to fix it, when fxmobile's library is needed but cannot be loaded.
    """
    if not isinstance(family, OpFamily):
        raise InvalidArgumentError(
            f"ensure_registered() expects an OpFamily member (one of "
            f"{', '.join(f.name for f in OpFamily)}), got {family!r}"
        )
    with _lock:
        provider = _status.get(family)
        if provider is None:
            provider = _register(family)
            _status[family] = provider
        return provider


def registration_status() -> dict[OpFamily, Provider]:
    """Registers every family (where needed) and reports, per family, who provides it."""
    return {family: ensure_registered(family) for family in OpFamily}


def _register(family: OpFamily) -> Provider:
    try:
        extension = _load_extension()
    except ExtensionUnavailableError:
        # Without fxmobile's library a torch that has the family natively still works.
        if torch._C._jit_get_schemas_for_operator(_SENTINEL_OPS[family]):
            return Provider.NATIVE
        raise
    try:
        return Provider(extension.register_family(family.value))
    except RuntimeError as e:
        raise ExtensionUnavailableError(
            f"fxmobile._C could not register the {family.name} op family: {e}"
        ) from e


def _load_extension() -> ModuleType:
    global _extension
    if _extension is not None:
        return _extension
    try:
        _extension = importlib.import_module("fxmobile._C")
    except ModuleNotFoundError as e:
        raise ExtensionUnavailableError(
            f"fxmobile's operator library (fxmobile._C) is not built. {_BUILD_HINT}"
        ) from e
    except ImportError as e:
        # Typically "undefined symbol": the library was compiled against another torch.
        raise ExtensionUnavailableError(
            f"fxmobile's operator library (fxmobile._C) cannot be loaded into torch "
            f"{torch.__version__}: {e}. It was probably built against a different torch; "
            f"rebuild it. {_BUILD_HINT}"
        ) from e
    return _extension


def _register_all_at_import() -> None:
    for family in OpFamily:
        # Not cached on failure: ensure_registered tries again and raises the clear error.
        with contextlib.suppress(ExtensionUnavailableError):
            ensure_registered(family)


_register_all_at_import()
