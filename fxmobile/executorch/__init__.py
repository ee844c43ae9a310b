"""The ExecuTorch target: a ``.pte`` program for ExecuTorch's XNNPACK delegate.

The model goes through fxmobile's capture and FX passes as for a lite-interpreter file, then:

- ``export``: ``torch.export`` of the optimized graph, refused with export's reason when it
  cannot take the model;
- ``passes``: rewrites of the exported ATen graph so that the XNNPACK delegate computes all it
  can, in as few partitions as it can (``passes/pipeline.py`` holds their order);
- ``lower``: ExecuTorch's edge dialect, the XNNPACK partitioner and the program, with each op
  left on portable kernels and the partitioner's reason for it;
- ``runtime``: the program run in ExecuTorch's runtime, for the gate and for latency;
- ``program_file``: what a ``.pte`` file holds (delegates, portable ops, size).

ExecuTorch is an optional dependency: ``require`` says how to install it when it is missing.
"""

from __future__ import annotations

import importlib.util

from fxmobile.errors import MissingDependencyError

INSTALL_HINT = (
    "install it with `pip install 'fxmobile[executorch]'` (`make install` does, into .venv)"
)


def available() -> bool:
    """Whether ExecuTorch can be imported here."""
    return importlib.util.find_spec("executorch") is not None


def require(what: str) -> None:
    """Raise ``MissingDependencyError`` naming ``what`` needs ExecuTorch, when it is missing."""
    if not available():
        raise MissingDependencyError(
            f"{what} needs ExecuTorch, which is not installed: {INSTALL_HINT}"
        )
