"""Mobile compatibility: a file's bytecode and operator versions, which reference runtime loads
it, backports, and the recorded runtime figures measured again on the real runtimes.

The verdict logic is tested here against the catalogue (and against a catalogue entry changed
with monkeypatch, to reach the refusals no reference runtime triggers with today's files); the
runtime-marked tests load the files in the real torch 1.13.1 and 2.12.1.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.jit.mobile
import torch.nn.functional as F
from torch import nn

from fxmobile.cli import main
from fxmobile.errors import InvalidValueError
from fxmobile.runtime import RUNTIMES, IncompatibleRuntimeError, RuntimeLoadError, RuntimeProcess
from fxmobile.runtime.compat import (
    LOWEST_BACKPORT,
    backport_for,
    backport_to_bytecode,
    bytecode_version,
    file_compatibility,
)
from fxmobile.runtime.measure import measure
from fxmobile.runtime.samples import sample_file
from fxmobile.script.serialization import lite_interpreter_bytes
from tests.conftest import EACH_RUNTIME
from tests.helpers import assert_equivalent

Runtime = Callable[[str], RuntimeProcess]


class ChangedMeanings(nn.Module):
    """Calls operators whose meaning torch changed: gelu (at operator version 10), linspace
    (8) and div (4)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x) / 2 + torch.linspace(0, 1, 4)


class Attention(nn.Module):
    """scaled_dot_product_attention: an operator torch 2.0 added, missing from 1.13."""

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q)


def lite_bytes(module: nn.Module) -> bytes:
    return lite_interpreter_bytes(torch.jit.script(module.eval()))


def run_here(data: bytes, *inputs: torch.Tensor) -> torch.Tensor:
    import fxmobile

    fxmobile.registration_status()
    with torch.no_grad():
        return torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(data))(*inputs)


@pytest.fixture(scope="module")
def sample() -> tuple[bytes, tuple[torch.Tensor, ...]]:
    return sample_file()


def test_an_fxmobile_file_loads_on_every_reference_runtime(
    sample: tuple[bytes, tuple[torch.Tensor, ...]],
) -> None:
    found = file_compatibility(sample[0])
    assert found.bytecode_version == 8
    assert found.operator_version == 3  # no operator whose meaning changed
    assert found.versioned_operators == []
    assert found.operators["prepacked::conv2d_clamp_run"] == 2
    assert all(v.loads for v in found.verdicts.values())
    assert found.oldest_runtime == "1.13.1"
    assert found.operators_checked == []


def test_operator_versions_come_from_torchs_upgrader_map() -> None:
    found = file_compatibility(lite_bytes(ChangedMeanings()))
    assert [(op.name, op.version) for op in found.versioned_operators] == [
        ("aten::gelu", 10),
        ("aten::linspace", 8),
        ("aten::div.Scalar", 4),
    ]
    assert found.operator_version == 10
    assert found.oldest_runtime == "1.13.1"  # both reference runtimes know operator version 10


def test_an_operator_newer_than_the_runtime_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runtime that knows operator versions up to 9 would run gelu's old meaning."""
    older = dataclasses.replace(RUNTIMES["1.13.1"], max_operator_version=9)
    monkeypatch.setitem(RUNTIMES, "1.13.1", older)
    data = lite_bytes(ChangedMeanings())
    verdict = file_compatibility(data).verdicts["1.13.1"]
    assert not verdict.loads and not verdict.after_backport
    assert "aten::gelu (operator version 10)" in verdict.reason
    assert "aten::linspace" not in verdict.reason  # 8: that runtime knows it
    assert file_compatibility(data).oldest_runtime == "2.12.1"
    with pytest.raises(IncompatibleRuntimeError, match=r"aten::gelu \(operator version 10\)"):
        backport_for("1.13.1", data)


def test_backport_for_leaves_a_file_the_runtime_reads_unchanged(
    sample: tuple[bytes, tuple[torch.Tensor, ...]],
) -> None:
    assert backport_for("1.13.1", sample[0]) is sample[0]


def test_upstream_bug_backport_returns_empty_bytes_instead_of_raising(
    sample: tuple[bytes, tuple[torch.Tensor, ...]],
) -> None:
    """torch's _backport_for_mobile_to_buffer gives b"" for a version it cannot write (and for
    the file's own version); backport_to_bytecode checks the result and says so."""
    data = sample[0]
    assert torch.jit.mobile._backport_for_mobile_to_buffer(io.BytesIO(data), 3) == b""
    with pytest.raises(
        IncompatibleRuntimeError, match="from bytecode 8 to 3; it writes bytecode 4"
    ):
        backport_to_bytecode(data, LOWEST_BACKPORT - 1)
    assert backport_to_bytecode(data, 8) is data
    with pytest.raises(InvalidValueError, match="only lowers it"):
        backport_to_bytecode(data, 9)


def test_upstream_bug_ops_and_info_of_a_buffer_reads_a_path() -> None:
    """torch.jit.mobile._get_model_ops_and_info(BytesIO) passes the bytes to the path overload;
    file_compatibility calls the buffer binding."""
    data = lite_bytes(ChangedMeanings())
    with pytest.raises(RuntimeError, match="open file failed"):
        torch.jit.mobile._get_model_ops_and_info(io.BytesIO(data))
    assert "aten::gelu" in file_compatibility(data).operators


def test_a_file_without_bytecode_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "full.pt"
    torch.jit.save(torch.jit.script(ChangedMeanings()), str(path))
    with pytest.raises(InvalidValueError, match="no lite-interpreter bytecode"):
        file_compatibility(path)


def test_inspect_prints_versions_and_the_oldest_runtime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "changed.ptl"
    path.write_bytes(lite_bytes(ChangedMeanings()))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "mobile compatibility: bytecode 8, operator version 10" in out
    assert "aten::gelu 10, aten::linspace 8, aten::div.Scalar 4" in out
    assert "oldest reference runtime that loads it: torch 1.13.1" in out
    assert main(["inspect", str(path), "--format", "json"]) == 0
    assert '"oldest_runtime": "1.13.1"' in capsys.readouterr().out


# --- on the real runtimes ---------------------------------------------------------------


@pytest.mark.parametrize("version", EACH_RUNTIME)
def test_recorded_figures_are_what_the_runtime_says(
    runtime: Runtime, version: str, sample: tuple[bytes, tuple[torch.Tensor, ...]]
) -> None:
    """The catalogue's bytecode range, loadable versions and operator version, measured."""
    found = measure(runtime(version), *sample)
    spec = RUNTIMES[version]
    assert found.bytecode_range == spec.bytecode_range
    assert found.loaded_bytecode == spec.loaded_bytecode
    assert found.refused_bytecode == {}
    assert found.max_operator_version == spec.max_operator_version


@pytest.mark.runtime("1.13.1")
def test_a_backported_fxmobile_file_runs_on_torch_1_13_1_as_here(
    runtime: Runtime,
    monkeypatch: pytest.MonkeyPatch,
    sample: tuple[bytes, tuple[torch.Tensor, ...]],
) -> None:
    """backport_for rewrites the bytecode down to the runtime's newest version; proved with
    1.13.1's recorded range narrowed to 4-7 (as an app's older lite interpreter states it),
    then loaded and run in the real 1.13.1."""
    data, inputs = sample
    narrowed = dataclasses.replace(RUNTIMES["1.13.1"], bytecode_range=(4, 7))
    monkeypatch.setitem(RUNTIMES, "1.13.1", narrowed)
    verdict = file_compatibility(data).verdicts["1.13.1"]
    assert not verdict.loads and verdict.after_backport
    backported = backport_for("1.13.1", data)
    assert bytecode_version(backported) == 7
    loaded = runtime("1.13.1").load(backported)
    try:
        there = loaded.run(*inputs)
    finally:
        loaded.close()
    assert_equivalent(lambda *x: run_here(data, *x), lambda *x: there, *inputs, rel=1e-5)


@pytest.mark.runtime("1.13.1", "2.12.1")
def test_a_missing_operator_is_named_and_the_real_runtime_agrees(runtime: Runtime) -> None:
    data = lite_bytes(Attention())
    operators = {v: runtime(v).operators() for v in RUNTIMES}
    found = file_compatibility(data, operators)
    assert found.operators_checked == ["1.13.1", "2.12.1"]
    assert not found.verdicts["1.13.1"].loads
    assert "lacks aten::scaled_dot_product_attention" in found.verdicts["1.13.1"].reason
    assert found.oldest_runtime == "2.12.1"
    with pytest.raises(RuntimeLoadError, match="aten::scaled_dot_product_attention"):
        runtime("1.13.1").load(data)
    q = torch.randn(1, 2, 4, 8)
    loaded = runtime("2.12.1").load(data)
    assert_equivalent(Attention(), lambda x: loaded.run(x), q, rel=1e-5)
    loaded.close()


@pytest.mark.runtime("1.13.1", "2.12.1")
def test_every_operator_of_an_fxmobile_file_exists_on_both_runtimes(
    runtime: Runtime, sample: tuple[bytes, tuple[torch.Tensor, ...]]
) -> None:
    operators = {v: runtime(v).operators() for v in RUNTIMES}
    found = file_compatibility(sample[0], operators)
    assert all(v.loads for v in found.verdicts.values()), found.verdicts


@pytest.mark.runtime("1.13.1", "2.12.1")
def test_the_recorded_missing_operators_are_what_the_runtimes_say(runtime: Runtime) -> None:
    """RuntimeSpec.lacks, measured: each named operator is absent there; the newer runtime has
    scaled_dot_product_attention, so only 1.13.1 names it."""
    for version, spec in RUNTIMES.items():
        operators = runtime(version).operators()
        assert not [op for op in spec.lacks if op in operators], version
    assert "aten::scaled_dot_product_attention" in runtime("2.12.1").operators()
    assert RUNTIMES["1.13.1"].lacks == ("aten::scaled_dot_product_attention",)


class Encoder(nn.Module):
    """nn.MultiheadAttention as torchvision's ViTs call it: scaled_dot_product_attention."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention(x, x, x, need_weights=False)[0] + x


@pytest.mark.runtime("1.13.1")
def test_attention_optimized_for_1_13_1_loads_and_runs_there(runtime: Runtime) -> None:
    import fxmobile
    from fxmobile.api import lite_file

    torch.manual_seed(0)
    model = Encoder().eval()
    x = torch.randn(2, 5, 16)
    result = fxmobile.optimize(model, example_inputs=x, target_runtime="1.13.1")
    loaded = runtime("1.13.1").load(lite_file(result.module, "1.13.1"))
    try:
        assert_equivalent(model, lambda t: loaded.run(t), x, rel=1e-5)
    finally:
        loaded.close()
