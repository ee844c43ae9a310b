"""The backends fxmobile can target, and what each one runs: one typed spec per backend.

Each backend's folder holds its rewrites and its ``pipeline.py``, which exports ``SPEC``; this
module maps the ``Backend`` members (``fxmobile.options``) to those specs.
"""

from __future__ import annotations

from fxmobile.backends.metal.pipeline import SPEC as METAL
from fxmobile.backends.spec import BackendSpec
from fxmobile.backends.vulkan.pipeline import SPEC as VULKAN
from fxmobile.backends.xnnpack.pipeline import SPEC as XNNPACK
from fxmobile.options import Backend

SPECS: dict[Backend, BackendSpec] = {
    Backend.CPU: XNNPACK,
    Backend.VULKAN: VULKAN,
    Backend.METAL: METAL,
}


def backend_spec(backend: Backend) -> BackendSpec:
    """What ``backend`` runs: its op family, passes and markers."""
    return SPECS[backend]
