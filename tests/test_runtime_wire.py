"""The wire between fxmobile and a reference runtime's process, here (no runtime needed), and the
catalogue and install stamps that say whether a runtime is there.

The same values crossing to the real runtimes and back are in tests/test_runtime_process.py.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from fxmobile.errors import InvalidValueError
from fxmobile.runtime import RUNTIMES, RuntimeNotInstalledError, RuntimeProcess, installed
from fxmobile.runtime import install as install_module
from fxmobile.runtime.server import (
    DTYPES,
    WireError,
    decode_value,
    encode_value,
    read_message,
    runtime_message,
    write_message,
)


def round_trip(value: object) -> object:
    """``value`` written as one message and read back, as the pipes carry it."""
    buffers: list[bytes] = []
    tree = encode_value(value, buffers)
    stream = io.BytesIO()
    write_message(stream, {"value": tree}, buffers)
    stream.seek(0)
    header, received = read_message(stream)
    return decode_value(header["value"], received)


def assert_same(a: object, b: object) -> None:
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert torch.equal(a, b)
    elif isinstance(a, tuple | list):
        assert isinstance(b, tuple | list)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, float) and a != a:
        assert b != b  # NaN
    else:
        assert a == b


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips_bit_exact(dtype: str) -> None:
    generator = torch.Generator().manual_seed(0)
    source = torch.randn(3, 5, generator=generator) * 100
    value = source.to(getattr(torch, dtype))
    assert_same(value, round_trip(value))


def test_nested_structures_and_scalars_keep_their_kinds() -> None:
    value = (
        torch.arange(6.0).reshape(2, 3),
        [1, 2.5, True, None, "text", float("nan"), float("-inf")],
        {"logits": torch.ones(2), 3: (torch.zeros(0, 4),)},
        (),
    )
    assert_same(value, round_trip(value))


def test_layouts_arrive_as_the_same_values() -> None:
    """Channels-last, transposed and offset views arrive with the same elements (row-major)."""
    base = torch.randn(2, 3, 4, 5)
    for view in (
        base.contiguous(memory_format=torch.channels_last),
        base.transpose(1, 3),
        base[:, 1:, ::2],
    ):
        got = round_trip(view)
        assert isinstance(got, torch.Tensor)
        assert torch.equal(got, view)


def test_received_tensors_are_writable_and_independent() -> None:
    value = torch.ones(4)
    got = round_trip(value)
    assert isinstance(got, torch.Tensor)
    got.add_(1)
    assert torch.equal(value, torch.ones(4))


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (torch.ones(2, dtype=torch.complex64), "complex64"),
        (torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8), "quint8"),
        (object(), "builtins.object"),
        ({1, 2}, "builtins.set"),
    ],
)
def test_values_that_cannot_travel_are_refused_by_name(value: object, named: str) -> None:
    with pytest.raises(WireError, match=named):
        encode_value(value, [])


def test_a_stream_cut_mid_message_is_an_error_and_a_clean_end_is_eof() -> None:
    stream = io.BytesIO()
    write_message(stream, {"op": "x"}, [b"abcdef"])
    whole = stream.getvalue()
    with pytest.raises(WireError, match="ended after"):
        read_message(io.BytesIO(whole[:-2]))
    with pytest.raises(EOFError):
        read_message(io.BytesIO(b""))


def test_runtime_message_drops_the_cpp_backtrace() -> None:
    error = RuntimeError(
        "Unknown builtin op: foo::bar.\nException raised from findOp at x.cpp:12\nframe #0: ..."
    )
    assert runtime_message(error) == "Unknown builtin op: foo::bar."


# --- the catalogue and the install stamps -----------------------------------------------------


def test_catalogue_pins_each_runtime_exactly() -> None:
    assert list(RUNTIMES) == ["1.13.1", "2.12.1"]  # oldest first: compat relies on the order
    for version, spec in RUNTIMES.items():
        assert f"torch=={version}" in spec.requirements
        assert all("==" in requirement for requirement in spec.requirements)
        assert spec.folder_name == f"torch-{version}"


def _stamp(requirements: list[str], left_out: list[str] | None = None) -> str:
    left = list(install_module.LEFT_OUT) if left_out is None else left_out
    return json.dumps({"requirements": requirements, "left_out": left})


def _fake_install(root: Path, version: str, requirements: list[str]) -> None:
    folder = root / f"torch-{version}"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_text("")
    (folder / install_module.STAMP).write_text(_stamp(requirements))


def test_a_runtime_counts_as_installed_only_with_a_stamp_of_its_pins(tmp_path: Path) -> None:
    spec = RUNTIMES["1.13.1"]
    stamp = tmp_path / "torch-1.13.1" / install_module.STAMP
    assert not installed("1.13.1", tmp_path)
    _fake_install(tmp_path, "1.13.1", ["torch==1.13.0"])  # other pins: made again by install
    assert not installed("1.13.1", tmp_path)
    stamp.write_text(_stamp(list(spec.requirements), left_out=[]))  # made before LEFT_OUT
    assert not installed("1.13.1", tmp_path)
    stamp.write_text(_stamp(list(spec.requirements)))
    assert installed("1.13.1", tmp_path)


def test_a_runtime_gets_its_pins_requirements_but_those_left_out() -> None:
    # Run here on this venv's torch: what install() asks pip for after the pins themselves.
    wanted = install_module._requirements_of(sys.executable, ("torch==2.15.0",))
    names = {install_module._normalized(install_module._name_of(r)) for r in wanted}
    assert "filelock" in names and "sympy" in names
    assert "triton" not in names and "torch" not in names
    assert all(";" not in r for r in wanted)  # markers evaluated here, not passed on


def test_too_little_free_disk_is_refused_before_pip_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = RUNTIMES["2.12.1"]
    monkeypatch.setattr(
        install_module.shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10, 9, 2**30)
    )
    shortfall = r"torch-2\.12\.1 needs about 5\.4 GiB.*1\.0 GiB are"
    with pytest.raises(install_module.NotEnoughDiskError, match=shortfall):
        install_module.install(spec, tmp_path)
    assert not (tmp_path / spec.folder_name).exists()
    assert install_module.main([str(tmp_path)]) == 3
    assert install_module.main(["--if-room", str(tmp_path)]) == 0  # CI goes on without them
    assert not (tmp_path / spec.folder_name).exists()


def test_the_recorded_disk_figures_are_what_the_installs_took() -> None:
    # An installed runtime's stamp measured its venv; the catalogue's figure (the free-disk check
    # and the README use it) must still say the same, within 10%.
    specs: list[install_module.RuntimeSpec | install_module.PeerSpec] = [
        *RUNTIMES.values(),
        *install_module.PEERS.values(),
    ]
    checked = [(spec, install_module.read_stamp(spec)) for spec in specs]
    checked = [(spec, stamp) for spec, stamp in checked if stamp is not None]
    if not checked:
        pytest.skip("no runtime installed (make runtimes)")
    for spec, stamp in checked:
        assert stamp is not None
        measured, figure = int(str(stamp["bytes"])) / 2**30, spec.disk_gib
        name = spec.folder_name
        assert abs(measured - figure) <= 0.1 * figure, (name, measured, figure)


def test_install_leaves_a_stamped_runtime_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = RUNTIMES["2.12.1"]
    _fake_install(tmp_path, "2.12.1", list(spec.requirements))
    stamp = install_module.install(spec, tmp_path)  # would need the network if it installed
    assert stamp["requirements"] == list(spec.requirements)
    assert "nothing to do" in capsys.readouterr().out


def test_a_missing_runtime_names_make_runtimes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(install_module.DIR_VARIABLE, str(tmp_path))
    with pytest.raises(RuntimeNotInstalledError, match="make runtimes") as caught:
        RuntimeProcess("1.13.1")
    assert str(tmp_path / "torch-1.13.1") in str(caught.value)


def test_an_unknown_runtime_lists_the_known_ones() -> None:
    with pytest.raises(InvalidValueError, match=r"known: 1\.13\.1, 2\.12\.1"):
        RuntimeProcess("1.12.0")
