"""A fresh process loads fxmobile files after ``import fxmobile`` and nothing else.

``import fxmobile`` registers the operator library (fxmobile.backends.library), so
``torch.jit.load`` and ``_load_for_lite_interpreter`` find the context classes and operators a
saved file names. Each check runs in a new interpreter, since this one registered them long
ago: files holding a context of every class (all three families) and a whole
``fxmobile.optimize`` result are saved here, loaded there, and must give the outputs they gave
here. Without ``fxmobile._C``, ``import fxmobile`` still works and the error, saying how to
build the library, comes when a family is needed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import fxmobile
from tests.test_ops_serialization import CASES, _module

ROOT = Path(__file__).resolve().parents[1]

# Loads every file listed in files.pt with both loaders and compares the outputs.
LOADER = """
import sys, torch
{prelude}
from torch.jit.mobile import _load_for_lite_interpreter
saved = torch.load(sys.argv[1])
for name, (inputs, expected) in saved.items():
    for load in (torch.jit.load, _load_for_lite_interpreter):
        got = load(sys.argv[2] + "/" + name)(*inputs)
        got = got if isinstance(got, tuple) else (got,)
        expected_t = expected if isinstance(expected, tuple) else (expected,)
        assert all(torch.equal(g, e) for g, e in zip(got, expected_t, strict=True)), name
print("loaded", len(saved))
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


class _SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean((2, 3)))


@pytest.fixture(scope="module")
def saved_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file per context class and one fxmobile.optimize result, with inputs and outputs."""
    fxmobile.registration_status()  # in this process, whatever import did
    directory = tmp_path_factory.mktemp("fresh_process")
    saved: dict[str, tuple[tuple[torch.Tensor, ...], object]] = {}
    for i, case in enumerate(CASES):
        ctx, _ = case.make()
        inputs = case.inputs()
        module = _module(ctx, case.forward, len(inputs))
        name = f"context{i}.ptl"  # the lite format holds the TorchScript code too
        module._save_for_lite_interpreter(str(directory / name))
        saved[name] = (inputs, module(*inputs))
    model = _SmallNet().eval()
    x = torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(0))
    result = fxmobile.optimize(model, example_inputs=x)
    result.save(directory / "optimized.ptl")
    saved["optimized.ptl"] = ((x,), result.module(x))
    torch.save(saved, directory / "files.pt")
    return directory


def test_import_fxmobile_is_all_a_fresh_process_needs(saved_files: Path) -> None:
    done = _python(
        LOADER.format(prelude="import fxmobile"), str(saved_files / "files.pt"), str(saved_files)
    )
    assert done.returncode == 0, done.stderr
    assert f"loaded {len(CASES) + 1}" in done.stdout


def test_without_fxmobile_the_files_do_not_load(saved_files: Path) -> None:
    """The control: the same loader without `import fxmobile` fails on the context class."""
    done = _python(LOADER.format(prelude=""), str(saved_files / "files.pt"), str(saved_files))
    assert done.returncode != 0
    assert "__torch__.torch.classes." in done.stderr


def test_import_works_without_the_extension_and_needing_it_explains() -> None:
    done = _python(
        """
        import sys
        sys.modules["fxmobile._C"] = None  # as if fxmobile._C had never been built
        import torch, fxmobile
        try:
            fxmobile.registration_status()
        except fxmobile.FxMobileError as e:
            print("error:", e)
        try:
            fxmobile.optimize(torch.nn.Conv2d(3, 4, 3).eval())
        except fxmobile.FxMobileError as e:
            print("error:", e)
        """
    )
    assert done.returncode == 0, done.stderr
    errors = [line for line in done.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, done.stdout
    for line in errors:
        assert "fxmobile._C) is not built" in line and "make install" in line
