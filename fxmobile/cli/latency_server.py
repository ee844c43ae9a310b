"""The clean child process the command line times in (``fxmobile.cli.latency`` starts it).

Run by path with the command's own python (``python -I latency_server.py READ_FD WRITE_FD
PARENT_PID THREADS DEATH_SIGNAL``, as ``fxmobile.runtime.process.RuntimeProcess`` starts every
server), so it begins with the environment the parent set for it, ``OMP_WAIT_POLICY`` and
``OMP_NUM_THREADS`` included, before torch loads OpenMP. It serves what a reference runtime's
server does (load a lite-interpreter or TorchScript file, run it, time it), with every fxmobile
op family registered, and two requests of its own:

- ``load_model``: the eager model a SPEC names, built as the command built it
  (``fxmobile.cli.models.load_model``, under the same seed, importing with the parent's
  ``sys_path``), then given the parent's ``state`` (a ``torch.save``-d state dict), so it times
  the very weights the command checked;
- ``load_program``: a ``.pte`` in ExecuTorch's runtime, its XNNPACK thread pool sized to the
  child's thread count.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from fxmobile.runtime import server


class _Forward:
    """A callable kept under a handle: the server calls a module's ``forward`` attribute."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self.forward = call


class LatencyServer(server.Server):
    """``server.Server`` with fxmobile's operators, eager models from a SPEC, and programs."""

    def __init__(self, torch: Any) -> None:
        super().__init__(torch)
        from fxmobile.cli.script_files import register_all_families

        register_all_families()

    def load_model(self, request: dict[str, Any], _: list[bytearray]) -> tuple[dict, list]:
        """The eager model of ``spec`` (``shapes``: its --input-shape), with ``state`` loaded."""
        for entry in reversed(request.get("sys_path", [])):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        from fxmobile.cli.models import load_model

        shapes = [tuple(s) for s in request["shapes"]] if request.get("shapes") else None
        model = load_model(request["spec"], shapes).model
        if request.get("state"):
            model.load_state_dict(self.torch.load(request["state"], weights_only=True))
        return self._keep(_Forward(model)), []  # model(...) runs its hooks, as the parent does

    def load_program(self, request: dict[str, Any], _: list[bytearray]) -> tuple[dict, list]:
        """An ExecuTorch program; the reply says the size its XNNPACK thread pool took."""
        from fxmobile.executorch.runtime import ProgramRunner, set_threads

        threads = set_threads(self.torch.get_num_threads())
        reply = self._keep(_Forward(ProgramRunner(request["path"])))
        return {**reply, "threads": threads}, []

    def handlers(self) -> dict[str, Callable[[dict[str, Any], list[bytearray]], tuple]]:
        """The reference runtimes' requests and this server's two."""
        return {
            **super().handlers(),
            "load_model": self.load_model,
            "load_program": self.load_program,
        }


if __name__ == "__main__":
    sys.exit(server.main(sys.argv[1:], LatencyServer))
