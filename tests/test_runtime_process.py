"""The reference runtimes in their own processes: values both ways, loading, running, timing,
errors in the runtime's words, threads, and a child that never outlives its parent.

Run against the real torch 1.13.1 and 2.12.1 (``make runtimes``); skipped, with the reason in
pytest's summary, without them. One process per runtime is shared by the session (the
``runtime`` fixture); the tests that kill or configure a child start their own.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.jit.mobile
from torch import nn

import fxmobile
from fxmobile.runtime import (
    RuntimeCallError,
    RuntimeCrashedError,
    RuntimeLoadError,
    RuntimeProcess,
)
from fxmobile.runtime.samples import sample_file, with_bytecode_number
from fxmobile.runtime.server import DTYPES
from tests.conftest import EACH_RUNTIME
from tests.helpers import assert_equivalent
from tests.test_runtime_wire import assert_same

Runtime = Callable[[str], RuntimeProcess]


def run_here(data: bytes, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The file in this process's lite interpreter, on fxmobile's operator library."""
    fxmobile.registration_status()
    with torch.no_grad():
        return torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(data))(*inputs)


@pytest.fixture(scope="module")
def sample() -> tuple[bytes, tuple[torch.Tensor, ...]]:
    return sample_file()


@pytest.mark.parametrize("version", EACH_RUNTIME)
def test_values_cross_both_ways_unchanged(runtime: Runtime, version: str) -> None:
    """Encoded by torch 2.15, decoded and encoded again by the runtime's torch, decoded here."""
    generator = torch.Generator().manual_seed(0)
    tensors = [(torch.randn(2, 3, generator=generator) * 50).to(getattr(torch, d)) for d in DTYPES]
    value = (
        tensors,
        {"nested": (torch.zeros(0, 3), [1, 2.5, None, "s", True]), 7: float("inf")},
        torch.randn(1, 4, 3, 3).contiguous(memory_format=torch.channels_last),
    )
    assert_same(value, runtime(version).echo(value))


@pytest.mark.parametrize("version", EACH_RUNTIME)
def test_runtime_reports_itself(runtime: Runtime, version: str) -> None:
    info = runtime(version).info
    assert info.torch == version
    assert info.threads == 2
    assert info.xnnpack  # both reference wheels were built with XNNPACK
    assert info.omp_wait_policy == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    assert info.pid != os.getpid()


@pytest.mark.parametrize("version", EACH_RUNTIME)
def test_fxmobile_file_runs_there_as_here(
    runtime: Runtime, version: str, sample: tuple[bytes, tuple[torch.Tensor, ...]]
) -> None:
    data, inputs = sample
    loaded = runtime(version).load(data)
    try:
        there = loaded.run(*inputs)
        assert_equivalent(lambda *x: run_here(data, x), lambda *x: there, *inputs, rel=1e-5)
    finally:
        loaded.close()


@pytest.mark.parametrize("version", EACH_RUNTIME)
def test_time_returns_one_time_per_call(
    runtime: Runtime, version: str, sample: tuple[bytes, tuple[torch.Tensor, ...]]
) -> None:
    data, inputs = sample
    loaded = runtime(version).load(data)
    times = loaded.time(5, *inputs, warmup=1)
    loaded.close()
    assert len(times) == 5
    assert all(t > 0 for t in times)


@pytest.mark.parametrize("version", EACH_RUNTIME)
def test_load_refusal_carries_the_runtimes_own_message(
    runtime: Runtime, version: str, sample: tuple[bytes, tuple[torch.Tensor, ...]]
) -> None:
    with pytest.raises(RuntimeLoadError) as caught:
        runtime(version).load(with_bytecode_number(sample[0], 99))
    assert "The model version must be between 4 and 9 but the model version is 99" in (
        caught.value.runtime_message
    )
    assert f"torch {version}'s lite interpreter cannot load" in str(caught.value)
    assert "Exception raised from" not in str(caught.value)  # no C++ backtrace


@pytest.mark.parametrize("version", EACH_RUNTIME)
def test_a_failing_call_reports_the_runtimes_message_and_the_process_stays_up(
    runtime: Runtime, version: str, sample: tuple[bytes, tuple[torch.Tensor, ...]]
) -> None:
    data, inputs = sample
    process = runtime(version)
    loaded = process.load(data)
    with pytest.raises(RuntimeCallError) as caught:
        loaded.run(torch.randn(16, 16))
    assert caught.value.runtime_message == "required rank 4 tensor to use channels_last format"
    assert loaded.run(*inputs).shape == (1, 4)  # still serving
    loaded.close()


@pytest.mark.parametrize("version", EACH_RUNTIME)
def test_upstream_bug_real_runtimes_run_a_conv_on_the_wrong_channel_count(
    runtime: Runtime, version: str, sample: tuple[bytes, tuple[torch.Tensor, ...]]
) -> None:
    """torch's XNNPACK prepacked::conv2d_clamp_run checks neither fewer nor more input channels
    than its weight has (it reads past the input); fxmobile's kernel refuses. A wrong
    --input-shape therefore fails here, before any runtime runs it (``fxmobile check``)."""
    data, _ = sample
    loaded = runtime(version).load(data)
    for channels in (2, 5):  # the conv takes 3
        assert loaded.run(torch.randn(1, channels, 16, 16)).shape == (1, 4)
        with pytest.raises(RuntimeError, match=f"the input has {channels} channels"):
            run_here(data, (torch.randn(1, channels, 16, 16),))
    loaded.close()


@pytest.mark.runtime("2.12.1")
def test_upstream_optimize_for_mobile_runs_in_the_runtime(runtime: Runtime, tmp_path: Path) -> None:
    """torch 2.12.1's own optimize_for_mobile on a file scripted here gives eager's outputs."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    model.eval()
    scripted = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(model), str(scripted))
    output = tmp_path / "upstream.ptl"
    x = torch.randn(1, 3, 8, 8)
    loaded = runtime("2.12.1").upstream_optimized(scripted, output=output)
    assert_equivalent(model, lambda t: loaded.run(t), x, rel=1e-5)
    loaded.close()
    operators = torch.jit.mobile._get_model_ops_and_info(str(output))
    assert "prepacked::conv2d_clamp_run" in operators
    assert "prepacked::linear_clamp_run" in operators
    assert "aten::conv2d" not in operators


@pytest.mark.runtime("2.12.1")
def test_threads_reach_the_child() -> None:
    with RuntimeProcess("2.12.1", threads=1) as process:
        assert process.info.threads == 1


@pytest.mark.runtime("1.13.1")
def test_a_killed_child_is_reported_with_its_signal(
    sample: tuple[bytes, tuple[torch.Tensor, ...]],
) -> None:
    process = RuntimeProcess("1.13.1")
    try:
        os.kill(process.info.pid, 9)
        with pytest.raises(RuntimeCrashedError, match="killed by SIGKILL"):
            process.load(sample[0])
    finally:
        process.close()


_PARENT = """
import sys, time
from fxmobile.runtime import RuntimeProcess
process = RuntimeProcess(sys.argv[1])
print(process.info.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as gone
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.runtime("1.13.1")
def test_the_child_dies_with_its_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, "1.13.1"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()  # SIGKILL: no cleanup runs in the parent
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child)
    finally:
        parent.kill()


@pytest.mark.runtime("2.12.1")
def test_a_child_started_from_a_worker_thread_outlives_that_thread() -> None:
    """Linux's parent-death signal fires when the starting *thread* ends; a child started from
    a worker thread relies on its watchdog instead and keeps serving."""
    started: list[RuntimeProcess] = []
    worker = threading.Thread(target=lambda: started.append(RuntimeProcess("2.12.1")))
    worker.start()
    worker.join()
    time.sleep(1.0)  # the watchdog looks every 0.5 s
    try:
        assert started[0].echo([1, "x"]) == [1, "x"]
    finally:
        started[0].close()
