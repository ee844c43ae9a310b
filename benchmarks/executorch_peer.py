"""ExecuTorch 1.5.1 with its XNNPACK delegate, as a peer of ``bench_peers.py``, in its own venv.

``make peers`` installs the venv (``.runtimes/executorch-1.5.1``, its own torch: ExecuTorch's
export path and runtime link the torch of its release). ``bench_peers.py`` starts this file
there with ``fxmobile.runtime.RuntimeProcess(..., python=..., script=...)``: it serves the
reference runtimes' requests (``fxmobile/runtime/server.py``, imported by path: it is standard
library only) and one more, ``lower_torchvision``:

- build the torchvision model ``name`` in this torch, load the weights the parent saved
  (``torch.save`` of its ``state_dict``: random weights, randomized BatchNorm statistics, so the
  outputs can be compared with eager's there);
- ``torch.export.export`` it on an input of ``shape``, ``to_edge_transform_and_lower`` with
  ``XnnpackPartitioner`` (what ExecuTorch's XNNPACK tutorial does), ``to_executorch``, and
  write the ``.pte``;
- load it in ExecuTorch's runtime (``executorch.runtime.Runtime``) and keep its ``forward``,
  which the ``run`` and ``time`` requests then call like any loaded file.

The XNNPACK delegate's thread pool gets the same thread count as the torches
(``_unsafe_reset_threadpool``); the reply says how many delegate calls the lowered graph makes
and which ops stay outside the delegate.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fxmobile" / "runtime"))
import server


class ExecuTorchForward:
    """A loaded ``.pte`` method called like a module: ``forward(*inputs)``."""

    def __init__(self, method: Any) -> None:
        self.method = method

    def forward(self, *inputs: Any) -> Any:
        outputs = self.method.execute(list(inputs))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


class ExecuTorchServer(server.Server):
    """The reference-runtime server with ExecuTorch's request added (``lower_torchvision``) and
    its ``hello`` extended: it sizes the XNNPACK thread pool to torch's thread count and
    reports ExecuTorch's version and that pool's size."""

    def hello(self) -> dict[str, Any]:
        from executorch.extension.pybindings import portable_lib
        from executorch.version import __version__

        portable_lib._unsafe_reset_threadpool(self.torch.get_num_threads())
        return {
            **super().hello(),
            "executorch": __version__.split("+")[0],
            "executorch_threads": portable_lib._threadpool_get_thread_count(),
        }

    def handlers(self) -> dict[str, Any]:
        return {**super().handlers(), "lower_torchvision": self.lower_torchvision}

    def lower_torchvision(self, request: dict[str, Any], _: list[bytearray]) -> tuple[dict, list]:
        torch = self.torch
        import torchvision
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower
        from executorch.runtime import Runtime

        start = time.perf_counter()
        model = torchvision.models.get_model(request["name"], weights=None)
        model.load_state_dict(torch.load(request["weights"], weights_only=True))
        model.eval()
        example = (torch.randn(*request["shape"]),)
        with torch.no_grad():
            exported = torch.export.export(model, example)
        lowered = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
        delegated = sum(
            1
            for node in lowered.exported_program().graph.nodes
            if node.op == "call_function" and "executorch_call_delegate" in str(node.target)
        )
        left = sorted(
            {
                str(node.target)
                for node in lowered.exported_program().graph.nodes
                if node.op == "call_function"
                and "executorch_call_delegate" not in str(node.target)
                and "getitem" not in str(node.target)
            }
        )
        program = lowered.to_executorch()
        with open(request["output"], "wb") as f:
            f.write(program.buffer)
        lower_s = time.perf_counter() - start
        method = Runtime.get().load_program(request["output"]).load_method("forward")
        reply = self._keep(ExecuTorchForward(method))
        reply.update(
            {
                "lower_s": lower_s,
                "pte_bytes": len(program.buffer),
                "delegate_calls": delegated,
                "ops_outside_delegate": left,
            }
        )
        return reply, []


if __name__ == "__main__":
    sys.exit(server.main(sys.argv[1:], ExecuTorchServer))
