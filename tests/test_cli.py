"""The ``fxmobile`` command line, run in-process through ``main`` (plus one real subprocess).

Each optimize test checks the file it wrote, not only the exit status: it loads the file with the
lite interpreter and compares it with the eager model (``assert_equivalent``), or counts the real
operators and packed contexts in it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.jit.mobile
from torch import nn
from torch.jit.mobile import _get_model_bytecode_version

from fxmobile.cli import main
from fxmobile.script.lints import generate_mobile_module_lints
from tests.helpers import assert_equivalent

MODEL_SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    """conv -> BN (non-trivial statistics) -> relu -> global mean -> linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for tensor in [*self.parameters(), self.bn.running_mean]:
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.5)
            self.bn.running_var.copy_(torch.rand(8, generator=gen) + 0.5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean((2, 3)))

    @torch.jit.export
    def features(self, x):
        return self.conv(x)

    def not_exported(self, x):
        return x


class NeedsArgs(nn.Module):
    def __init__(self, width, depth=2):
        super().__init__()
        self.fc = nn.Linear(width, width)


def make_net():
    return Net()


def example_inputs():
    return (torch.randn(1, 3, 12, 12),)
'''

SHAPE = "1,3,12,12"


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def import_source(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_test_cli_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lite_ops(path: Path) -> set[str]:
    lite = torch.jit.mobile._load_for_lite_interpreter(str(path))
    return {op.split(".")[0] for op in torch.jit.mobile._export_operator_list(lite)}


def forward_ops(path: Path) -> dict[str, int]:
    from fxmobile.script.graph_utils import op_histogram

    return dict(op_histogram(torch.jit.load(str(path)), ["forward"]))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "net.py"
    path.write_text(MODEL_SOURCE)
    return path


@pytest.fixture(scope="module")
def net(model_file: Path) -> nn.Module:
    return import_source(model_file).Net().eval()


@pytest.fixture(scope="module")
def optimized_file(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Net optimized for the CPU by the CLI, shared by the lint and inspect tests."""
    out = tmp_path_factory.mktemp("out") / "net.ptl"
    assert main(["optimize", f"{model_file}:Net", "-o", str(out), "--input-shape", SHAPE]) == 0
    return out


# --- optimize -------------------------------------------------------------------------------------


def test_optimize_python_file_writes_a_lite_file_that_matches_eager(
    model_file: Path, net: nn.Module, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "net.ptl"  # the parent directory is created
    code, stdout, err = cli(
        capsys, "optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE
    )
    assert code == 0, err
    assert "fxmobile report: Net for CPU" in stdout
    assert "fold_batchnorm" in stdout
    assert "INPUT_NOT_CHANNELS_LAST" not in stdout  # the CPU default runs channels-last
    check = stdout.split("lite interpreter vs eager:")[1]
    assert "ok" in check.split("\n\n")[0] and "MISMATCH" not in stdout
    lite = torch.jit.mobile._load_for_lite_interpreter(str(out))
    assert_equivalent(net, lite, torch.randn(1, 3, 12, 12), rel=1e-4)
    assert {"prepacked::conv2d_clamp_run", "prepacked::linear_clamp_run"} <= lite_ops(out)
    assert "aten::conv2d" not in lite_ops(out) and "aten::batch_norm" not in lite_ops(out)


def test_factory_function_and_example_inputs_from_the_file_json(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.ptl"
    code, stdout, _ = cli(
        capsys, "optimize", f"{model_file}:make_net", "-o", out, "--format", "json"
    )
    assert code == 0
    payload = json.loads(stdout)  # stdout carries the JSON document alone
    assert payload["output"] == str(out)
    assert payload["file_bytes"] == out.stat().st_size
    assert payload["report"]["backend"] == "CPU"
    assert payload["report"]["ops_after"]["prepacked::conv2d_clamp_run"] == 1
    [check] = payload["file_numerics"]  # example_inputs() in the file gave the inputs
    assert check["passed"] and check["relative_error"] <= 1e-4
    assert payload["failures"] == []


def test_torchvision_model_with_randomized_batchnorm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "resnet18.ptl"
    code, stdout, err = cli(
        capsys,
        "optimize",
        "torchvision:resnet18",
        "-o",
        out,
        "--input-shape",
        "1,3,32,32",
        "--format",
        "json",
    )
    assert code == 0, err
    assert "randomized the running statistics of its 20 BatchNorm layers" in err
    payload = json.loads(stdout)
    report = payload["report"]
    assert report["model"] == "ResNet"
    folds = [p for p in report["passes"] if p["name"] == "fold_batchnorm" and p["stage"] == "fx"]
    assert folds[0]["rewrites"] == 20
    assert report["ops_after"]["prepacked::conv2d_clamp_run"] == 20
    assert report["ops_after"]["prepacked::linear_clamp_run"] == 1
    assert all(c["passed"] for c in payload["file_numerics"])
    assert forward_ops(out)["prepacked::conv2d_clamp_run"] == 20


def test_saved_torchscript_files_as_spec(
    net: nn.Module, optimized_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(net), str(scripted))
    out = tmp_path / "from_pt.ptl"
    code, stdout, err = cli(capsys, "optimize", scripted, "-o", out, "--input-shape", SHAPE)
    assert code == 0, err
    assert "lite interpreter vs original TorchScript:" in stdout
    assert_equivalent(
        net,
        torch.jit.mobile._load_for_lite_interpreter(str(out)),
        torch.randn(1, 3, 12, 12),
        rel=1e-4,
    )
    # a file fxmobile wrote holds prepacked ops and contexts; it loads and optimizes again,
    # without inputs too (then nothing is checked, and the output says so)
    again = tmp_path / "again.ptl"
    code, stdout, err = cli(capsys, "optimize", optimized_file, "-o", again)
    assert code == 0, err
    assert "lite interpreter vs original TorchScript: not checked, no example inputs" in stdout
    assert forward_ops(again)["prepacked::conv2d_clamp_run"] == 1


@pytest.mark.parametrize(
    ("backend", "conv_op", "marker"),
    [
        ("vulkan", "vulkan_prepack::run_conv2d_context", "optimized_for_vulkan"),
        ("metal", "metal_prepack::conv2d_run", "optimized_for_metal"),
    ],
)
def test_gpu_backends_with_the_transfer_blocklisted_are_checked(
    backend: str,
    conv_op: str,
    marker: str,
    model_file: Path,
    net: nn.Module,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / f"net_{backend}.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE]
    code, stdout, err = cli(
        capsys, *argv, "--backend", backend.upper(), "--blocklist", "vulkan_automatic_gpu_transfer"
    )
    assert code == 0, err
    assert f"fxmobile report: Net for {backend.upper()}" in stdout
    assert "lite interpreter vs eager:\noutput" in stdout
    assert conv_op in lite_ops(out)
    assert torch.jit.load(str(out))._c.getattr(marker) is True
    assert_equivalent(
        net,
        torch.jit.mobile._load_for_lite_interpreter(str(out)),
        torch.randn(1, 3, 12, 12),
        rel=1e-4,
    )


def test_vulkan_with_the_gpu_transfer_is_saved_but_not_checked(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net_vulkan.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE, "--latency"]
    code, stdout, err = cli(capsys, *argv, "--backend", "vulkan")
    assert code == 0, err
    assert "lite interpreter vs eager: not checked" in stdout
    assert "latency: not measured" in stdout
    assert "VULKAN_AUTOMATIC_GPU_TRANSFER" in stdout  # the report's note says how to check it
    assert "aten::to" in lite_ops(out)


def test_blocklist_names_are_case_insensitive_and_take_effect(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE, "--format", "json"]
    code, stdout, _ = cli(
        capsys, *argv, "--blocklist", "Insert-Fold-Prepack-Ops", "--blocklist", "REMOVE_DROPOUT"
    )
    assert code == 0
    report = json.loads(stdout)["report"]
    statuses = {(p["stage"], p["name"]): p["status"] for p in report["passes"]}
    assert statuses[("fx", "remove_dropout")] == "blocklisted"
    assert report["ops_after"].get("prepacked::conv2d_clamp_run", 0) == 0
    assert forward_ops(out)["aten::conv2d"] == 1
    assert "prepacked::conv2d_clamp_run" not in lite_ops(out)


def test_python_file_imports_its_neighbours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "blocks.py").write_text(
        "from torch import nn\n\n"
        "def block():\n    return nn.Sequential(nn.Linear(6, 3), nn.ReLU())\n"
    )
    (tmp_path / "model.py").write_text(
        "from torch import nn\nfrom blocks import block\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.body = block()\n\n"
        "    def forward(self, x):\n        return self.body(x)\n"
    )
    out = tmp_path / "model.ptl"
    argv = ["optimize", f"{tmp_path}/model.py:Model", "-o", out, "--input-shape", "2,6"]
    code, _, err = cli(capsys, *argv, "--no-bundled-inputs")  # their methods have ops too
    assert code == 0, err
    assert lite_ops(out) == {"prepacked::linear_clamp_run"}  # relu fused into the linear


def test_channels_last_markdown_and_latency(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.ptl"
    threads = torch.get_num_threads()
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE]
    code, stdout, err = cli(
        capsys,
        *argv,
        "--no-channels-last",
        "--format",
        "markdown",
        "--latency",
        "--rounds",
        "3",
        "--threads",
        "1",
    )
    assert code == 0, err
    assert "| stage " in stdout and "|---" in stdout  # GitHub tables
    assert "INPUT_NOT_CHANNELS_LAST" in stdout  # eager's layout kept, as asked
    latency = stdout.split("| candidate")[1]
    for row in ("eager", "optimized TorchScript", "lite interpreter"):
        assert f"| {row}" in latency
    assert "3 rounds" in latency and "in a clean child process: 1 thread," in latency
    assert torch.get_num_threads() == threads  # timed in the child, not here


def test_preserved_method_is_kept(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE]
    code, _, err = cli(capsys, *argv, "--preserved-methods", "features")
    assert code == 0, err
    assert set(torch.jit.load(str(out))._c._method_names()) >= {"forward", "features"}


def test_numerics_failure_prints_the_report_then_exits_1(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE]
    code, stdout, err = cli(capsys, *argv, "--tolerance", "0")  # BN folding rounds differently
    assert code == 1
    assert "fxmobile report: Net" in stdout and "MISMATCH" in stdout
    error = err.splitlines()[-1]
    assert error.startswith("fxmobile: error: fxmobile's optimized Net does not match eager: ")
    assert "the outputs first diverge after fx pass 'fold_batchnorm'" in error
    assert not out.exists(), "the gate returns no module, so nothing is written"


def test_check_warn_writes_the_file_and_warns(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE, "--check", "warn"]
    code, stdout, err = cli(capsys, *argv, "--tolerance", "0")
    assert code == 0 and out.exists()
    assert "MISMATCH" in stdout
    assert "fxmobile: warning: numerics check failed: " in err


# --- error paths ----------------------------------------------------------------------------------


def _checkpoint(tmp: Path, net: nn.Module, optimized_file: Path) -> Path:
    path = tmp / "weights.pt"
    torch.save(net.state_dict(), path)
    return path


def _lite_only(tmp: Path, net: nn.Module, optimized_file: Path) -> Path:
    """The optimized file without its TorchScript code: only the lite interpreter reads it."""
    path = tmp / "lite_only.ptl"
    with zipfile.ZipFile(optimized_file) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            if "/code/" not in info.filename:
                dst.writestr(info, src.read(info))
    return path


def _garbage(tmp: Path, net: nn.Module, optimized_file: Path) -> Path:
    path = tmp / "garbage.pt"
    path.write_bytes(b"not a model")
    return path


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (_checkpoint, "a torch.save checkpoint"),
        (_lite_only, "only the lite interpreter can read this file"),
        (_garbage, "not a zip archive"),
    ],
)
def test_unreadable_files_are_explained(
    make: Any,
    needle: str,
    net: nn.Module,
    optimized_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = make(tmp_path, net, optimized_file)
    for argv in (["optimize", path, "-o", tmp_path / "x.ptl"], ["lint", path], ["inspect", path]):
        code, _, err = cli(capsys, *argv)
        assert code == 1
        assert err.startswith(f"fxmobile: error: {path}: ") and needle in err
        assert "Traceback" not in err and "miniz" not in err


@pytest.mark.parametrize(
    ("args", "status", "needles"),
    [
        (["timm:resnet18"], 1, ["unknown SPEC prefix 'timm:'", "torchvision:NAME"]),
        (["{tmp}/missing.pt"], 1, ["missing.pt: no such file"]),
        (["{tmp}/missing.py:Net"], 1, ["missing.py: no such file"]),
        (["{model}:Nope"], 1, ["has no class or function 'Nope'", "Net, NeedsArgs"]),
        (["{model}"], 1, ["name the model after a colon", "Net, NeedsArgs"]),
        (["{model}:NeedsArgs"], 1, ["NeedsArgs() needs arguments (width)", "make_model"]),
        (["torchvision:resnet19"], 1, ["torchvision has no model 'resnet19'", "resnet18"]),
        (["torchvision:resnet18", "--weights", "FOO"], 1, ["'FOO'", "IMAGENET1K_V1"]),
        (["torchvision:resnet18", "--input-shape", "1,3"], 1, ["ResNet does not run on input 1,3"]),
        (["{model}:Net", "--weights", "DEFAULT"], 1, ["--weights applies to torchvision"]),
        (["{model}:Net", "--preserved-methods", "nope"], 1, ["Net has no method 'nope'"]),
        (["{model}:Net", "--preserved-methods", "not_exported"], 1, ["@torch.jit.export"]),
        (["{model}:NeedsArgs", "--input-shape", "1,3,a"], 1, ["'1,3,a' is not a shape"]),
        (["{model}:Net", "--input-shape", "1,0,3"], 1, ["'1,0,3' is not a shape"]),
        (["{model}:Net", "--blocklist", "fold_all"], 1, ["'fold_all' is not an", "remove_dropout"]),
        (["{model}:Net", "--backend", "cuda"], 1, ["invalid choice: 'cuda'", "vulkan"]),
        (["{model}:Net", "--threads", "0"], 1, ["'0' is not a positive integer"]),
        (["{model}:Net", "--no-such-option"], 1, ["unrecognized arguments: --no-such-option"]),
        (["{model}:Net", "--input-shape", "1,3,5"], 1, ["example_inputs do not run through"]),
        (["{model}:Net", "-o", "{tmp}"], 1, ["is a directory"]),
    ],
)
def test_optimize_errors_name_the_culprit(
    args: list[str],
    status: int,
    needles: list[str],
    model_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [a.format(tmp=tmp_path, model=model_file) for a in args]
    out = tmp_path / "out.ptl"
    code, stdout, err = cli(capsys, "optimize", "-o", out, *argv)  # a later -o wins
    assert code == status
    assert stdout == ""  # status lines and errors go to stderr
    for needle in needles:
        assert needle in err
    assert "Traceback" not in err and "usage:" not in err
    assert err.splitlines()[-1].startswith("fxmobile: error: ")  # one line, after any status
    assert not out.exists()


def test_latency_without_inputs_and_missing_output_are_refused(
    optimized_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "optimize", optimized_file, "-o", tmp_path / "x.ptl", "--latency")
    assert code == 1 and "--latency needs example inputs; pass --input-shape" in err
    code, _, err = cli(capsys, "optimize", optimized_file)
    assert code == 1 and "-o/--output" in err


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = cli(capsys, "optimize", "--help")
    assert code == 0
    assert "torchvision:NAME" in stdout and "example_inputs()" in stdout
    code, stdout, _ = cli(capsys, "--version")
    assert code == 0 and stdout.startswith("fxmobile ")
    code, _, err = cli(capsys)
    assert code == 1
    assert err == (
        "fxmobile: error: the following arguments are required: COMMAND (see `fxmobile --help`)\n"
    )


def test_python_dash_m_fxmobile_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fxmobile", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for command in ("optimize", "lint", "inspect"):
        assert command in done.stdout


# --- lint -----------------------------------------------------------------------------------------


BUNDLED_INPUT_MESSAGE = (
    "No bundled input for forward, please add bundled inputs before saving the module using "
    "torch.utils.bundled_inputs.augment_model_with_bundled_inputs."
)


def test_lint_of_a_file_without_bundled_inputs_names_only_the_missing_bundled_inputs(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE]
    code, stdout, _ = cli(capsys, *argv, "--no-bundled-inputs", "--format", "json")
    assert code == 0
    payload = json.loads(stdout)
    assert payload["bundled_inputs"] is None
    assert payload["bundled_inputs_note"] == "none (--no-bundled-inputs)"
    assert [lint["name"] for lint in payload["report"]["lints"]] == ["BUNDLED_INPUT"]
    code, stdout, _ = cli(capsys, "lint", out)
    assert code == 1
    assert stdout.split()[:2] == ["lint", "message"]
    assert "BUNDLED_INPUT" in stdout and f"1 lint(s) in {out}" in stdout
    code, stdout, _ = cli(capsys, "lint", out, "--format", "json")
    assert code == 1
    assert json.loads(stdout) == {
        "file": str(out),
        "lints": [{"name": "BUNDLED_INPUT", "message": BUNDLED_INPUT_MESSAGE}],
    }


def test_lint_exits_1_with_lints_and_lists_them(
    net: nn.Module, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scripted, unoptimized Net: every lint it should get, written out here."""
    path = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(net), str(path))
    grad = (
        "requires grad, please set torch.no_grad() to reduce memory usage and improve "
        "computation speed during inference phase."
    )
    unpacked = (
        "runs unpacked: optimize the module for a backend (and check its report for why this "
        "one was skipped) to prepack its weights."
    )
    expected = [
        ("BUNDLED_INPUT", BUNDLED_INPUT_MESSAGE),
        *(
            ("REQUIRES_GRAD", f"Param {name} {grad}")
            for name in ("conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias")
        ),
        (
            "BATCHNORM",
            "Operator aten::batch_norm exists, remember to call eval() before saving the module "
            "and optimize it (fxmobile.optimize_for_mobile) to fold the batch_norm operator.",
        ),
        ("NOT_PREPACKED", f"Operator aten::conv2d {unpacked}"),
        ("NOT_PREPACKED", f"Operator aten::linear {unpacked}"),
        (
            "INPUT_NOT_CHANNELS_LAST",
            "The model convolves its input but never makes it channels-last; pass "
            "channels_last=True (or feed channels-last tensors) for faster mobile kernels.",
        ),
    ]
    code, stdout, _ = cli(capsys, "lint", path, "--format", "json")
    assert code == 1
    assert [(lint["name"], lint["message"]) for lint in json.loads(stdout)["lints"]] == expected
    code, stdout, _ = cli(capsys, "lint", path)
    assert code == 1 and f"{len(expected)} lint(s) in {path}" in stdout
    rows = [line.split()[0] for line in stdout.splitlines()[2:] if line and not line[0].isspace()]
    assert rows[: len(expected)] == [name for name, _ in expected]


class _Clean(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")  # inside bundled_inputs
def test_lint_exits_0_on_a_model_without_lints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torch.utils.bundled_inputs import augment_model_with_bundled_inputs

    scripted = torch.jit.script(_Clean())
    augment_model_with_bundled_inputs(scripted, [(torch.zeros(1, 4),)])
    path = tmp_path / "clean.pt"
    torch.jit.save(scripted, str(path))
    assert generate_mobile_module_lints(torch.jit.load(str(path))) == []
    code, stdout, _ = cli(capsys, "lint", path)
    assert code == 0 and f"no lints in {path}" in stdout
    code, stdout, _ = cli(capsys, "lint", path, "--format", "json")
    assert code == 0 and json.loads(stdout)["lints"] == []


# --- inspect --------------------------------------------------------------------------------------


def test_inspect_counts_match_the_graph(
    optimized_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stdout, _ = cli(capsys, "inspect", optimized_file, "--format", "json")
    assert code == 0
    found = json.loads(stdout)
    ops = found["ops"]["forward"]
    assert ops == forward_ops(optimized_file)
    assert found["methods"] == ["forward"]  # the bundled inputs' methods are not the model's
    assert found["bundled_inputs"] == [["1x3x12x12 float32"]]
    assert found["file_bytes"] == optimized_file.stat().st_size
    assert found["markers"] == {
        "mobile_optimized": True,
        "optimized_for_vulkan": None,
        "optimized_for_metal": None,
    }
    shapes = {c["class_name"]: c["weight_shape"] for c in found["packed_contexts"]}
    assert shapes == {
        "__torch__.torch.classes.xnnpack.Conv2dOpContext": [8, 3, 3, 3],
        "__torch__.torch.classes.xnnpack.LinearOpContext": [4, 8],
    }
    assert len(found["packed_contexts"]) == (
        ops["prepacked::conv2d_clamp_run"] + ops["prepacked::linear_clamp_run"]
    )
    lite = torch.jit.mobile._load_for_lite_interpreter(str(optimized_file))
    assert found["lite_operators"] == sorted(torch.jit.mobile._export_operator_list(lite))
    # channels-last (the CPU default): the layout change in, and back to eager's on the way out
    assert found["unfused_ops"] == {"aten::contiguous": 2, "aten::mean": 1}

    code, stdout, _ = cli(capsys, "inspect", optimized_file, "--contexts")
    assert code == 0
    assert "__torch__.torch.classes.xnnpack.Conv2dOpContext" in stdout and "8x3x3x3" in stdout
    assert (
        "mobile_optimized=True" in stdout
        and "ops left unfused: 3 (aten::contiguous 2, aten::mean 1)" in stdout
    )
    assert "bundled inputs for forward (1): 1x3x12x12 float32" in stdout


def test_inspect_a_file_without_bytecode(
    net: nn.Module, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(net), str(path))
    code, stdout, _ = cli(capsys, "inspect", path, "--format", "json")
    assert code == 0
    found = json.loads(stdout)
    assert (
        found["lite_operators"] is None
        and "no lite-interpreter bytecode" in found["lite_operators_note"]
    )
    assert found["packed_contexts"] == []
    assert found["bundled_inputs"] is None
    assert found["methods"] == ["forward", "features"]
    assert found["ops"]["forward"]["aten::conv2d"] == 1
    assert found["ops"]["features"] == {"aten::conv2d": 1}


# --- the reference runtimes -----------------------------------------------------------------------


def test_target_runtime_writes_a_file_that_runtime_reads(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE]
    code, stdout, _ = cli(capsys, *argv, "--target-runtime", "1.13.1", "--format", "json")
    assert code == 0
    compatibility = json.loads(stdout)["report"]["compatibility"]
    assert compatibility["bytecode_version"] == _get_model_bytecode_version(str(out))
    assert compatibility["verdicts"]["1.13.1"]["loads"] is True
    assert compatibility["oldest_runtime"] == "1.13.1"


def test_unknown_target_runtime_is_a_usage_error(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["optimize", f"{model_file}:Net", "-o", tmp_path / "n.ptl", "--input-shape", SHAPE]
    code, _, err = cli(capsys, *argv, "--target-runtime", "1.9")
    assert code == 1 and "invalid choice: '1.9'" in err


@pytest.mark.runtime("2.12.1")
def test_optimize_checks_and_times_the_file_on_the_real_runtime(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE]
    code, stdout, _ = cli(capsys, *argv, "--runtime", "2.12.1", "--latency", "--rounds", "3")
    assert code == 0
    assert "torch 2.12.1  XNNPACK" in stdout  # the check row names runtime and kernels
    assert "upstream optimize_for_mobile on torch 2.12.1 against eager" in stdout
    rows = (
        "eager",
        "fxmobile file, clean child",
        "fxmobile file on 2.12.1",
        "upstream file on 2.12.1",
    )
    assert all(row in stdout for row in rows)
    assert "2 threads in every process" in stdout
    assert "torch 2.12.1 (reference runtime)" in stdout


def test_latency_rows_name_runtime_and_kernels(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE]
    code, stdout, _ = cli(capsys, *argv, "--latency", "--rounds", "2")
    assert code == 0
    header = next(line for line in stdout.splitlines() if line.startswith("candidate "))
    assert "runs on" in header and "kernels" in header
    assert "torch 2.15.0, clean child process" in stdout
    assert "fxmobile._C (desktop kernels)" in stdout


# --- exit status, one-line errors, streams --------------------------------------------------------


def test_an_argument_error_is_one_line_naming_the_argument_and_exit_1(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Argument errors exited 2 and printed argparse's whole usage block before."""
    out = tmp_path / "net.ptl"
    code, stdout, err = cli(capsys, "optimize", f"{model_file}:Net", "-o", out, "--threads", "0")
    assert code == 1 and stdout == ""
    assert err == (
        "fxmobile: error: argument --threads: '0' is not a positive integer "
        "(see `fxmobile optimize --help`)\n"
    )


def test_status_lines_go_to_stderr_in_every_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In table mode they went to stdout, mixed with the results, before."""
    out = tmp_path / "squeezenet.ptl"
    argv = ["optimize", "torchvision:squeezenet1_0", "-o", out, "--input-shape", "1,3,32,32"]
    for fmt in ("table", "json"):
        code, stdout, err = cli(capsys, *argv, "--format", fmt, "--check", "off")
        assert code == 0, err
        assert "optimizing torchvision:squeezenet1_0 for cpu (input 1x3x32x32)" in err
        assert "optimizing" not in stdout
    assert json.loads(stdout)["output"] == str(out)  # the last run's stdout: JSON alone


class _ClosedPipe:
    """stdout of a reader that has gone away."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        raise OSError("no descriptor")


def test_a_closed_stdout_ends_the_command_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    code = main(["passes"])
    assert code == 141
    assert capsys.readouterr().err == ""


def test_fxmobile_passes_into_a_closed_pipe_prints_no_traceback() -> None:
    """``fxmobile passes | head`` ended in a BrokenPipeError traceback before."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: every write fails
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fxmobile", "passes"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == 141


# --- bundled inputs -------------------------------------------------------------------------------


def test_an_optimized_file_lints_clean_and_carries_its_input_shapes(
    model_file: Path, optimized_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every file optimize wrote failed lint (BUNDLED_INPUT) before."""
    code, stdout, _ = cli(capsys, "lint", optimized_file)
    assert code == 0 and f"no lints in {optimized_file}" in stdout
    lite = torch.jit.mobile._load_for_lite_interpreter(str(optimized_file))
    [(x,)] = lite.run_method("get_all_bundled_inputs")
    assert x.shape == (1, 3, 12, 12) and x.dtype == torch.float32
    assert x.std() > 0.5  # drawn with torch.randn_like when the method runs, not zeros
    # a spec, not the tensor: the file grows by a few KiB however large the input
    bare = tmp_path / "bare.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", bare, "--input-shape", "1,3,120,120"]
    assert cli(capsys, *argv, "--no-bundled-inputs")[0] == 0
    bundled = tmp_path / "bundled.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", bundled, "--input-shape", "1,3,120,120"]
    code, stdout, _ = cli(capsys, *argv, "--format", "json")
    assert code == 0
    payload = json.loads(stdout)
    assert payload["bundled_inputs"] == ["1x3x120x120 float32, torch.randn_like"]
    assert payload["report"]["lints"] == []
    assert payload["report"]["file_bytes"] == bundled.stat().st_size
    assert 0 < bundled.stat().st_size - bare.stat().st_size < 8 * 1024 < 120 * 120 * 3 * 4


def test_check_takes_the_bundled_inputs_when_given_no_shapes(
    optimized_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``check FILE`` refused an optimized file without --input-shape before."""
    import fxmobile.cli.check_cmd as check_cmd
    from fxmobile.runtime.check import RuntimeCheck

    seen: list[tuple[Any, ...]] = []

    def record(data: bytes, inputs: Any, versions: Any, **kwargs: Any) -> list[RuntimeCheck]:
        seen.append(tuple(inputs))
        return [RuntimeCheck("2.12.1", "XNNPACK", True, 8, (4, 9), [], None)]

    monkeypatch.setattr(check_cmd, "check_on_runtimes", record)  # no runtime needed here
    code, stdout, err = cli(
        capsys, "check", optimized_file, "--runtime", "2.12.1", "--format", "json"
    )
    assert code == 0, err
    assert json.loads(stdout)["inputs"] == "the file's first bundled input"
    [(x,)] = seen
    assert x.shape == (1, 3, 12, 12)


EMBEDDING_SOURCE = """
import torch
from torch import nn


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4)

    def forward(self, tokens):
        return self.embedding(tokens).sum(1)


def example_inputs():
    return (torch.randint(0, 10, (2, 5)),)
"""


def test_integer_inputs_are_bundled_as_zeros(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "bag.py"
    source.write_text(EMBEDDING_SOURCE)
    out = tmp_path / "bag.ptl"
    code, stdout, err = cli(capsys, "optimize", f"{source}:Bag", "-o", out, "--format", "json")
    assert code == 0, err
    assert json.loads(stdout)["bundled_inputs"] == ["2x5 int64, zeros"]
    lite = torch.jit.mobile._load_for_lite_interpreter(str(out))
    [(tokens,)] = lite.run_method("get_all_bundled_inputs")
    assert tokens.dtype == torch.int64 and tokens.shape == (2, 5) and not tokens.any()
    assert lite(tokens).shape == (2, 4)


@pytest.mark.runtime()
def test_a_bundled_file_loads_and_checks_on_the_reference_runtimes_without_shapes(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for target in ("1.13.1", None):
        out = tmp_path / f"net-{target}.ptl"
        argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE]
        if target:
            argv += ["--target-runtime", target]
        assert cli(capsys, *argv)[0] == 0
        code, stdout, err = cli(capsys, "check", out, "--runtime", "all", "--format", "json")
        assert code == 0, err
        found = json.loads(stdout)
        assert found["inputs"] == "the file's first bundled input"
        assert [r["runtime"] for r in found["runtimes"] if r["passed"]] == ["1.13.1", "2.12.1"]


def test_check_of_a_lite_file_names_what_it_needs(
    optimized_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "check", optimized_file)
    assert code == 1
    assert err == (
        f"fxmobile: error: name the reference runtimes to check {optimized_file} on: "
        "--runtime 1.13.1|2.12.1|all (make runtimes installs them)\n"
    )
    code, _, err = cli(capsys, "check", optimized_file, "--runtime", "all", "--model", "x.py:N")
    assert code == 1 and "--model applies to ExecuTorch programs (.pte)" in err


# --- latency in a clean child ---------------------------------------------------------------------


def test_latency_is_measured_in_a_clean_child_with_passive_waits(
    model_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI timed in its own process, OpenMP threads spinning, before."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE, "--latency"]
    code, stdout, err = cli(capsys, *argv, "--rounds", "4", "--threads", "1", "--format", "json")
    assert code == 0, err
    latency = json.loads(stdout)["latency"]
    assert latency["where"] == "clean child process"
    assert latency["omp_wait_policy"] == "PASSIVE" and latency["threads"] == 1
    candidates = latency["candidates"]
    assert list(candidates) == ["eager", "optimized TorchScript", "lite interpreter"]
    for name, timing in candidates.items():
        assert timing["runs_on"] == "torch 2.15.0, clean child process", name
        assert len(timing["samples_ms"]) == timing["runs"] == 4
        assert timing["p10_ms"] <= timing["median_ms"] <= timing["p90_ms"]
    assert candidates["eager"]["kernels"] == "ATen"


def test_a_wide_spread_is_flagged_as_a_busy_machine(
    model_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Nothing warned before when p90/p10 showed the machine was busy."""
    import fxmobile.cli.latency as latency

    monkeypatch.setattr(latency, "BUSY_SPREAD", 0.5)  # every real p90/p10 is at least 1
    out = tmp_path / "net.ptl"
    argv = ["optimize", f"{model_file}:Net", "-o", out, "--input-shape", SHAPE, "--latency"]
    code, stdout, err = cli(capsys, *argv, "--rounds", "2")
    assert code == 0
    assert "fxmobile: warning: the machine was busy while timing" in err
    assert "for eager" in err and "medians and speed-ups are not reliable" in err
    assert "warning" not in stdout


def test_the_busy_threshold() -> None:
    from fxmobile.cli.latency import BUSY_SPREAD, busy
    from fxmobile.runtime.latency import Latency
    from fxmobile.timing import Timing

    def one(p10: float, p90: float) -> Latency:
        return Latency(Timing((p10 + p90) / 2, p10, p90, 20), "here", "ATen")

    assert busy({"quiet": one(10.0, 10.0 * BUSY_SPREAD)}) == []
    [warning] = busy({"quiet": one(10.0, 13.0), "eager": one(74.0, 3276.0)})
    assert "44.3x for eager" in warning and "for quiet" not in warning


def test_one_candidate_gets_no_speed_up_column() -> None:
    from fxmobile.runtime.latency import Latency, latency_table
    from fxmobile.timing import Timing

    one = {"program": Latency(Timing(2.0, 1.0, 3.0, 20), "here", "XNNPACK")}
    header = latency_table(one).splitlines()[0]
    assert "speed-up" not in header and header.split()[-2:] == ["p90", "ms"]


# --- one spelling per option ----------------------------------------------------------------------


def test_every_optimize_option_is_spelled_as_the_python_argument() -> None:
    """``--preserve`` was the command line's name for ``preserved_methods`` before."""
    import inspect as pyinspect

    import fxmobile
    from fxmobile.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    optimize_parser = commands.choices["optimize"]
    cli_names = {a.dest for a in optimize_parser._actions}
    python_names = set(pyinspect.signature(fxmobile.optimize).parameters)
    shared = {
        "blocklist",
        "preserved_methods",
        "backend",
        "channels_last",
        "tolerance",
        "check",
        "target_runtime",
    }
    assert shared <= cli_names & python_names
    for action in optimize_parser._actions:
        if action.dest in shared:
            assert f"--{action.dest.replace('_', '-')}" in action.option_strings
