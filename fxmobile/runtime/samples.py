"""A small fxmobile file to try runtimes with, and a file a runtime must refuse.

``sample_file()`` runs the CPU backend's TorchScript pipeline on a scripted conv -> BN -> clamp
-> depthwise conv -> mean -> linear network (random weights, random BatchNorm statistics):
prepacked convs and a prepacked linear, bytecode 8. ``with_bytecode_number`` rewrites the
version number at the head of a file's ``bytecode.pkl`` and nothing else, so a runtime's refusal
of an out-of-range number states the range it reads (the check runs before anything else is
read).
"""

from __future__ import annotations

import io
import zipfile

import torch
from torch import nn

from fxmobile.backends.library import ensure_registered
from fxmobile.backends.registry import backend_spec
from fxmobile.infra import PassManager
from fxmobile.options import Backend
from fxmobile.script.serialization import lite_interpreter_bytes
from fxmobile.script.stage import ScriptContext, ScriptStage


class SampleNet(nn.Module):
    """conv -> BN -> clamp -> conv -> mean -> linear: prepacked convs and a linear once
    optimized."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.clamp(self.bn(self.conv(x)), 0.0, 6.0)
        return self.fc(self.depthwise(y).mean((2, 3)))


def sample_file() -> tuple[bytes, tuple[torch.Tensor, ...]]:
    """A small fxmobile lite-interpreter file and an input for it."""
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = SampleNet().eval()
    with torch.no_grad():
        model.bn.running_mean = torch.randn(8, generator=generator)
        model.bn.running_var = torch.rand(8, generator=generator) + 0.5
    x = torch.randn(1, 3, 16, 16, generator=generator)
    ctx = ScriptContext(("forward",), ())
    spec = backend_spec(Backend.CPU)
    ensure_registered(spec.op_family)
    manager = PassManager(spec.passes(), ScriptStage(ctx), ctx, frozenset())
    module, _ = manager.run(torch.jit.script(model))
    return lite_interpreter_bytes(module), (x,)


def with_bytecode_number(data: bytes, number: int) -> bytes:
    """``data`` with the version number at the head of ``bytecode.pkl`` replaced (nothing else)."""
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            body = source.read(info)
            if info.filename.endswith("/bytecode.pkl"):
                # pickle protocol 2: PROTO 2, then the tuple's first item, BININT1 <version>
                if body[2:3] != b"K":
                    raise ValueError("bytecode.pkl does not start with a one-byte version")
                body = body[:3] + bytes([number]) + body[4:]
            target.writestr(info, body)
    return out.getvalue()
