"""``fxmobile check``: a file loaded and run in the real runtimes, compared with this process.

The CLI runs in-process through ``main`` (each run starts its own runtime processes, as a user's
would); the API tests reuse the session's processes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torch.utils.bundled_inputs
from torch import nn

from fxmobile.cli import main
from fxmobile.runtime import RUNTIMES, RuntimeProcess
from fxmobile.runtime.check import bundled_inputs, check_on_runtimes, run_here
from fxmobile.runtime.install import DIR_VARIABLE
from fxmobile.runtime.samples import sample_file, with_bytecode_number
from fxmobile.script.serialization import lite_interpreter_bytes

Runtime = Callable[[str], RuntimeProcess]


@pytest.fixture(scope="module")
def sample() -> tuple[bytes, tuple[torch.Tensor, ...]]:
    return sample_file()


@pytest.fixture
def sample_path(tmp_path: Path, sample: tuple[bytes, tuple[torch.Tensor, ...]]) -> Path:
    path = tmp_path / "sample.ptl"
    path.write_bytes(sample[0])
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.runtime()
def test_check_on_all_runtimes_prints_one_ok_row_each(
    capsys: pytest.CaptureFixture[str], sample_path: Path
) -> None:
    code, out, _ = cli(
        capsys, "check", sample_path, "--runtime", "all", "--input-shape", "1,3,16,16"
    )
    assert code == 0, out
    assert "compared with the file run here (fxmobile._C (desktop kernels))" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("torch ")]
    assert [row[:2] for row in rows] == [["torch", "1.13.1"], ["torch", "2.12.1"]]
    for row in rows:
        assert row[2] == "XNNPACK"  # the kernels that row ran on
        assert row[3:6] == ["yes", "yes", "(4-9)"]
        assert row[-1] == "ok"
        assert float(row[-2]) <= 1e-4


class Attention(nn.Module):
    """scaled_dot_product_attention: torch 2.0 added it, so 1.13.1 cannot load this file."""

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q)


@pytest.mark.runtime()
def test_a_file_a_runtime_refuses_exits_1_with_the_runtimes_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "attention.ptl"
    path.write_bytes(lite_interpreter_bytes(torch.jit.script(Attention().eval())))
    argv = ["check", path, "--runtime", "all", "--input-shape", "1,2,4,8", "--format", "json"]
    code, out, _ = cli(capsys, *argv)
    assert code == 1
    old, new = json.loads(out)["runtimes"]
    assert (old["runtime"], old["loads"], old["passed"]) == ("1.13.1", False, False)
    assert old["bytecode_accepted"] is True  # the bytecode is fine; the operator is missing
    assert "aten::scaled_dot_product_attention" in old["error"]
    assert (new["runtime"], new["loads"], new["passed"]) == ("2.12.1", True, True)


def test_a_file_this_process_cannot_load_is_refused_first(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    sample: tuple[bytes, tuple[torch.Tensor, ...]],
) -> None:
    path = tmp_path / "future.ptl"
    path.write_bytes(with_bytecode_number(sample[0], 99))
    code, _, err = cli(capsys, "check", path, "--runtime", "all", "--input-shape", "1,3,16,16")
    assert code == 1
    assert "this process's lite interpreter cannot load the file (Lite Interpreter version" in err


@pytest.mark.runtime()
def test_outputs_off_by_more_than_the_tolerance_are_a_mismatch(
    runtime: Runtime, sample: tuple[bytes, tuple[torch.Tensor, ...]]
) -> None:
    data, inputs = sample
    here = run_here(data, inputs)
    off = here + 1e-3 * here.abs().max()  # a reference 1e-3 of the scale away
    processes = {v: runtime(v) for v in RUNTIMES}
    found = check_on_runtimes(data, inputs, list(RUNTIMES), off, processes=processes)
    assert [c.passed for c in found] == [False, False]
    assert all(c.loads and c.relative_error is not None for c in found)
    assert all(9e-4 < (c.relative_error or 0) < 1.1e-3 for c in found)
    exact = check_on_runtimes(data, inputs, list(RUNTIMES), processes=processes)
    assert [c.passed for c in exact] == [True, True]
    assert all(not p._closed for p in processes.values())  # reused, not stopped


def test_inputs_the_file_does_not_take_are_refused_here_first(
    capsys: pytest.CaptureFixture[str], sample_path: Path
) -> None:
    code, _, err = cli(capsys, "check", sample_path, "--runtime", "all", "--input-shape", "16,16")
    assert code == 1
    assert "does not run here on these inputs (prepacked::conv2d_clamp_run: expected a 4-D" in err
    assert "Traceback" not in err


def test_without_shapes_or_bundled_inputs_it_asks_for_shapes(
    capsys: pytest.CaptureFixture[str], sample_path: Path
) -> None:
    code, _, err = cli(capsys, "check", sample_path, "--runtime", "all")
    assert code == 1
    assert "has no bundled inputs; pass the input shape(s), e.g. --input-shape" in err


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_bundled_inputs_are_the_default_inputs() -> None:
    scripted = torch.jit.script(nn.Sequential(nn.Linear(3, 2)).eval())
    x = torch.randn(4, 3)
    torch.utils.bundled_inputs.augment_model_with_bundled_inputs(scripted, [(x,)])
    (found,) = bundled_inputs(lite_interpreter_bytes(scripted))
    assert torch.equal(found[0], x)


def test_a_missing_runtime_names_make_runtimes(
    capsys: pytest.CaptureFixture[str],
    sample_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DIR_VARIABLE, str(tmp_path / "none"))
    code, _, err = cli(
        capsys, "check", sample_path, "--runtime", "2.12.1", "--input-shape", "1,3,16,16"
    )
    assert code == 1
    assert "reference runtime torch 2.12.1 is not installed" in err
    assert "run `make runtimes`" in err
