"""ExecuTorch programs on the command line: ``optimize -o model.pte``, ``check``, ``inspect`` and
``lint`` of a ``.pte``. Each optimize test runs the file it wrote in ExecuTorch's runtime."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from fxmobile.cli import main
from fxmobile.cli.check_program import NO_REFERENCE
from fxmobile.executorch.program_file import is_program, read_program
from fxmobile.executorch.runtime import ProgramRunner
from tests.helpers import assert_equivalent

pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed")

SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    """conv -> BN -> relu -> cumsum (no XNNPACK kernel) -> linear: two delegates."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.fc(torch.cumsum(y, 1))


def other_weights():
    torch.manual_seed(1)  # the same network with other weights: not what the program holds
    return Net()


def example_inputs():
    return (torch.randn(1, 3, 12, 12),)
'''


def import_source(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_test_cli_et_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "etnet.py"
    path.write_text(SOURCE)
    return path


@pytest.fixture(scope="module")
def written(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """Net as a .pte, written by the command line with --latency; the path and the JSON."""
    out = tmp_path_factory.mktemp("out") / "net.pte"
    argv = ["optimize", f"{model_file}:Net", "-o", str(out), "--target-runtime", "executorch"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main([*argv, "--latency", "--rounds", "3", "--threads", "1", "--format", "json"])
    assert code == 0
    return out, json.loads(stdout.getvalue())


@pytest.fixture(scope="module")
def program(written: tuple[Path, Any]) -> Path:
    return written[0]


def test_a_pte_output_writes_a_program_that_matches_eager(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.pte"
    code, stdout, err = cli(capsys, "optimize", f"{model_file}:Net", "-o", out)
    assert code == 0, err
    assert "optimizing" in err and "for an ExecuTorch program (input 1x3x12x12)" in err
    assert "ExecuTorch program:" in stdout  # the report's program section
    check = stdout.split("ExecuTorch program vs eager:")[1].split("\n\n")[0]
    assert " ok" in check and "MISMATCH" not in stdout
    assert "bundled inputs" not in stdout  # a .ptl thing
    assert is_program(out)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the command line builds file models under seed 0
        net = import_source(model_file).Net().eval()
    assert_equivalent(net, ProgramRunner(str(out)), torch.randn(1, 3, 12, 12), rel=1e-4)


def test_target_runtime_executorch_is_the_same_and_its_json_carries_the_program(
    written: tuple[Path, Any],
) -> None:
    out, payload = written
    program = payload["report"]["program"]
    assert program["nbytes"] == out.stat().st_size == payload["file_bytes"]
    assert program["delegate_calls"] == read_program(out).method().delegate_calls == 2
    assert payload["file_run_by"] == "ExecuTorch program"
    assert all(c["passed"] for c in payload["file_numerics"])


def test_latency_of_a_program_against_eager_in_a_clean_child(written: tuple[Path, Any]) -> None:
    latency = written[1]["latency"]
    assert latency["where"] == "clean child process" and latency["threads"] == 1
    assert list(latency["candidates"]) == ["eager", "ExecuTorch program"]
    program = latency["candidates"]["ExecuTorch program"]
    assert program["kernels"] == "ExecuTorch 1.5.1: XNNPACK delegate + portable kernels"
    assert program["runs"] == len(program["samples_ms"]) == 3
    assert set(written[1]["report"]["latency"]) == {"eager", "ExecuTorch program"}


@pytest.mark.parametrize(
    ("extra", "output", "needle"),
    [
        (["--target-runtime", "executorch"], "net.ptl", "name the file"),
        (["--target-runtime", "2.12.1"], "net.pte", "does not read; name the file"),
        (["--backend", "vulkan"], "net.pte", "drop --backend vulkan"),
        (["--preserved-methods", "forward"], "net.pte", "--preserved-methods applies to"),
        (["--runtime", "all"], "net.pte", "--runtime applies to lite-interpreter files"),
    ],
)
def test_what_a_program_cannot_be_made_with_is_refused_in_one_line(
    extra: list[str],
    output: str,
    needle: str,
    model_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / output
    code, stdout, err = cli(capsys, "optimize", f"{model_file}:Net", "-o", out, *extra)
    assert code == 1 and stdout == ""
    assert needle in err and err.count("fxmobile: error:") == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_program_needs_an_eager_model_with_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted = tmp_path / "lin.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(scripted))
    code, _, err = cli(
        capsys, "optimize", scripted, "-o", tmp_path / "a.pte", "--input-shape", "1,2"
    )
    assert code == 1 and "is a TorchScript file; an ExecuTorch program is exported" in err
    (tmp_path / "noinputs.py").write_text(
        "from torch import nn\n\ndef lin():\n    return nn.Linear(2, 2)\n"
    )
    code, _, err = cli(capsys, "optimize", f"{tmp_path}/noinputs.py:lin", "-o", tmp_path / "b.pte")
    assert code == 1 and "needs example inputs (torch.export traces the model" in err


def test_check_without_a_reference_runs_it_twice_and_says_what_it_could_not_check(
    program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = program
    code, stdout, err = cli(capsys, "check", path, "--rounds", "3", "--format", "json")
    assert code == 0, err
    found = json.loads(stdout)
    checks = {c["check"]: c for c in found["checks"]}
    assert checks["runs"]["passed"] and checks["runs"]["detail"] == "outputs 1x4"
    assert checks["deterministic"]["passed"] and checks["finite"]["passed"]
    assert checks["matches eager"]["passed"] is None
    assert checks["matches eager"]["detail"] == NO_REFERENCE
    assert found["inputs"] == [{"shape": [1, 3, 12, 12], "dtype": "torch.float32"}]
    latency = found["latency"]
    assert list(latency["candidates"]) == ["ExecuTorch program"]
    assert latency["threads"] == 2 and latency["candidates"]["ExecuTorch program"]["runs"] == 3


def test_check_with_the_model_it_came_from_compares_with_eager_and_times_both(
    program: Path, model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = program
    argv = ["check", path, "--model", f"{model_file}:Net", "--rounds", "2", "--format", "json"]
    code, stdout, err = cli(capsys, *argv)
    assert code == 0, err
    found = json.loads(stdout)
    checks = {c["check"]: c for c in found["checks"]}
    assert checks["matches eager"]["passed"] is True
    assert all(c["relative_error"] <= 1e-4 for c in found["eager_numerics"])
    assert list(found["latency"]["candidates"]) == ["eager", "ExecuTorch program"]


def test_check_against_other_weights_fails(
    program: Path, model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = program
    argv = ["check", path, "--model", f"{model_file}:other_weights", "--rounds", "2"]
    code, stdout, _ = cli(capsys, *argv, "--threads", "1")
    assert code == 1
    assert "matches eager  FAILED" in stdout and "deterministic  ok" in stdout
    latency = stdout.split("\ncandidate ")[1]
    assert "median ms" in latency and "p10 ms" in latency and "p90 ms" in latency
    assert "in a clean child process: 1 thread," in latency


def test_check_of_a_program_refuses_what_does_not_apply(
    program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = program
    code, _, err = cli(capsys, "check", path, "--input-shape", "1,3,32,32")
    assert code == 1 and "takes inputs of shape 1x3x12x12 (torch.export fixed them)" in err
    code, _, err = cli(capsys, "check", path, "--runtime", "all")
    assert code == 1 and "drop --runtime" in err


def test_inspect_shows_the_delegates_the_kernel_calls_and_the_size(
    program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = program
    code, stdout, _ = cli(capsys, "inspect", path, "--format", "json")
    assert code == 0
    found = json.loads(stdout)
    assert found["nbytes"] == path.stat().st_size
    [forward] = found["methods"]
    assert forward["delegate_calls"] == 2
    assert {d["backend"] for d in forward["delegates"]} == {"XnnpackBackend"}
    assert forward["kernel_calls"]["aten::cumsum.out"] == 1
    code, stdout, _ = cli(capsys, "inspect", path)
    assert code == 0
    assert f"{path}: ExecuTorch program, " in stdout
    assert "forward(1x3x12x12 float32): 2 delegate call(s) (XnnpackBackend 2)" in stdout
    assert "aten::cumsum.out" in stdout and "XnnpackBackend" in stdout


def test_lint_of_a_program_is_refused_pointing_at_inspect(
    program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = program
    code, stdout, err = cli(capsys, "lint", path)
    assert code == 1 and stdout == ""
    assert err == (
        f"fxmobile: error: {path} is an ExecuTorch program; the lints are for TorchScript "
        f"files. fxmobile inspect {path} lists what it runs outside its delegates\n"
    )
