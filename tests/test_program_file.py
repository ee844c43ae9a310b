"""``fxmobile.executorch.program_file``: a ``.pte`` file's delegates, kernel calls, inputs and size,
read from its bytes, held to what the lowering that wrote it reported and to the file itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import fxmobile
from fxmobile.errors import InvalidValueError
from fxmobile.executorch.program_file import is_program, read_program

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")


class TwoPartitions(nn.Module):
    """conv -> relu -> linear in XNNPACK, a cumsum (no XNNPACK kernel) between two linears."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8, 6)
        self.out = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(torch.relu(self.conv(x)).amax((2, 3)))
        return self.out(torch.cumsum(y, 1))


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, fxmobile.ProgramResult]:
    torch.manual_seed(0)
    model = TwoPartitions().eval()
    result = fxmobile.optimize(
        model, example_inputs=torch.randn(2, 3, 10, 10), target_runtime="executorch"
    )
    path = tmp_path_factory.mktemp("pte") / "two.pte"
    result.save(path)
    return path, result


def test_the_file_says_what_the_lowering_reported(
    program: tuple[Path, fxmobile.ProgramResult],
) -> None:
    path, result = program
    facts = result.report.program
    assert facts is not None
    found = read_program(path)
    forward = found.method("forward")
    assert found.nbytes == path.stat().st_size == facts.nbytes
    assert forward.delegate_calls == facts.delegate_calls >= 2  # the cumsum splits them
    assert {d.backend for d in forward.delegates} == {"XnnpackBackend"}
    assert all(d.nbytes > 0 and d.calls == 1 for d in forward.delegates)
    # the lowering names edge ops (aten.cumsum), the file their out-variant kernels
    reported = {p.op.split(".")[1]: p.count for p in facts.portable_ops}
    in_file = {op.split("::")[1].split(".")[0]: n for op, n in forward.kernel_calls.items()}
    assert in_file == reported
    assert forward.kernel_calls["aten::cumsum.out"] == 1
    assert forward.inputs[0].kind == "tensor"
    assert forward.inputs[0].shape == (2, 3, 10, 10) and forward.inputs[0].dtype == "float32"


def test_the_weights_sit_in_named_data_and_are_counted_once(
    program: tuple[Path, fxmobile.ProgramResult],
) -> None:
    path, _ = program
    found = read_program(path)
    # conv (8x3x3x3 + 8), fc (6x8 + 6), out (4x6 + 4): float32, XNNPACK's packed copies at least
    weights = (8 * 27 + 8 + 6 * 8 + 6 + 4 * 6 + 4) * 4
    assert found.named_data >= 3
    assert found.named_data_bytes >= weights
    blobs = sum(d.nbytes for d in found.method().delegates)
    assert blobs + found.named_data_bytes + found.constant_bytes < found.nbytes
    assert found.to_dict()["methods"][0]["delegate_calls"] == found.method().delegate_calls


def test_a_lite_interpreter_file_or_garbage_is_not_a_program(tmp_path: Path) -> None:
    lite = tmp_path / "net.ptl"
    torch.jit.script(nn.Linear(2, 2))._save_for_lite_interpreter(str(lite))
    garbage = tmp_path / "garbage.pte"
    garbage.write_bytes(b"not a program at all")
    for path in (lite, garbage):
        assert not is_program(path)
        with pytest.raises(InvalidValueError, match="is not an ExecuTorch program"):
            read_program(path)


def test_a_truncated_program_is_refused_naming_the_file(
    program: tuple[Path, fxmobile.ProgramResult], tmp_path: Path
) -> None:
    path, _ = program
    cut = tmp_path / "cut.pte"
    cut.write_bytes(path.read_bytes()[:200])
    assert is_program(cut)
    with pytest.raises(InvalidValueError, match=r"cut\.pte: ExecuTorch cannot read this program"):
        read_program(cut)


def test_an_unknown_method_names_the_ones_there(
    program: tuple[Path, fxmobile.ProgramResult],
) -> None:
    with pytest.raises(InvalidValueError, match="no method 'backward'; it has forward"):
        read_program(program[0]).method("backward")
