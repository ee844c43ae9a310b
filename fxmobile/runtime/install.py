"""The reference runtimes: which torch releases, pinned how, installed where.

Run by path with any Python 3.11 (``python fxmobile/runtime/install.py [DIR]``, which is what
``make runtimes`` does; ``--peers`` for the benchmark's peers, ``make peers``; ``--if-room`` skips
a venv the free disk cannot hold instead of failing, for CI): it creates one
venv per runtime (or peer) under ``DIR`` (default ``.runtimes``
at the top of the checkout) with nothing in it but the pinned requirements and what pip pulls
in for them, and writes a stamp when the install succeeded. A venv whose stamp records the same
requirements is left alone, so running it again costs nothing; a venv without a stamp (an
interrupted install) or with other requirements is made again from scratch.

This module imports nothing but the standard library: it runs before any venv exists, and
``fxmobile.runtime`` imports its catalogue (``RUNTIMES``) from here, the one place it lives.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import venv
from dataclasses import dataclass
from pathlib import Path

# Overrides where the runtimes live (tests point it at a folder that has none).
DIR_VARIABLE = "FXMOBILE_RUNTIMES"
STAMP = ".fxmobile-runtime.json"
# The venvs use the Python that runs this file; torch 1.13.1's wheels stop at 3.11.
NEWEST_PYTHON = (3, 11)


# What pip would pull in for torch that no runtime or peer here ever imports: triton is the GPU
# compiler behind torch.compile's inductor (0.7 GiB per venv). Left out, the venvs fit on a
# machine with less free disk; `pip check` in them names it missing, on purpose.
LEFT_OUT = ("triton",)
# Room for pip's downloads and unpacking beyond the finished venv (torch's wheel is the largest).
DOWNLOAD_HEADROOM_GIB = 1.5


@dataclass(frozen=True)
class RuntimeSpec:
    """A reference runtime: its pins, why it is one, and the figures measured on it."""

    version: str  # torch's version, and the name users pass (--runtime 1.13.1)
    requirements: tuple[str, ...]
    role: str  # why it is a reference: shown by the CLI and the docs
    disk_gib: float  # the finished venv on disk, measured (its stamp's bytes)
    # Measured on the installed runtime (fxmobile/runtime/measure.py; tests/test_runtime_compat.py
    # fails when a figure here stops matching what the runtime says):
    bytecode_range: tuple[int, int]  # the lite interpreter's own range, from its refusal message
    loaded_bytecode: tuple[int, ...]  # versions of real files (backported here) that loaded and ran
    max_operator_version: int  # torch._C._get_max_operator_version() there
    # operators torch 2.15's graphs use that the runtime does not have (newer than it); the
    # TorchScript stage writes them out for it, and a file that keeps one is refused for it
    lacks: tuple[str, ...] = ()

    @property
    def folder_name(self) -> str:
        return f"torch-{self.version}"


RUNTIMES: dict[str, RuntimeSpec] = {
    spec.version: spec
    for spec in (
        # torch 1.13 predates numpy 2 and breaks with it; nothing here needs numpy, the pin keeps
        # a later install from pulling an incompatible one in.
        RuntimeSpec(
            "1.13.1",
            ("torch==1.13.1", "numpy==1.26.4"),
            "PyTorch Mobile 1.13.1 (pytorch_android_lite, LibTorch-Lite): what shipped apps load",
            disk_gib=3.2,
            bytecode_range=(4, 9),
            loaded_bytecode=(4, 5, 6, 7, 8),
            max_operator_version=10,
            lacks=("aten::scaled_dot_product_attention",),  # added in torch 2.0
        ),
        RuntimeSpec(
            "2.12.1",
            ("torch==2.12.1",),
            "the last torch built with XNNPACK: its own prepacked:: ops and XNNPACK kernels",
            disk_gib=3.9,
            bytecode_range=(4, 9),
            loaded_bytecode=(4, 5, 6, 7, 8),
            max_operator_version=10,
        ),
    )
}


@dataclass(frozen=True)
class PeerSpec:
    """A peer runtime the benchmarks compare with, in a venv of its own (it pins its own torch)."""

    name: str  # the folder is named after it: .runtimes/executorch-1.5.1
    requirements: tuple[str, ...]
    role: str
    disk_gib: float  # the finished venv on disk, measured (its stamp's bytes)

    @property
    def folder_name(self) -> str:
        return self.name


PEERS: dict[str, PeerSpec] = {
    spec.name: spec
    for spec in (
        # ExecuTorch's wheel names no torch; its pybindings link libtorch, so the torch of its
        # release (2.14) is pinned here, and the torchvision that builds the same models.
        PeerSpec(
            "executorch-1.5.1",
            ("executorch==1.5.1", "torch==2.14.1", "torchvision==0.29.2"),
            "ExecuTorch 1.5.1 with its XNNPACK delegate (benchmarks/bench_peers.py)",
            disk_gib=5.1,
        ),
    )
}


def default_dir() -> Path:
    """``$FXMOBILE_RUNTIMES``, else ``.runtimes`` at the top of the checkout."""
    override = os.environ.get(DIR_VARIABLE)
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / ".runtimes"


def venv_dir(spec: RuntimeSpec | PeerSpec, root: Path | None = None) -> Path:
    """The folder of ``spec``'s venv under ``root`` (default ``.runtimes/``)."""
    return (root or default_dir()) / spec.folder_name


def venv_python(spec: RuntimeSpec | PeerSpec, root: Path | None = None) -> Path:
    """The python executable of ``spec``'s venv."""
    return venv_dir(spec, root) / "bin" / "python"


def read_stamp(spec: RuntimeSpec | PeerSpec, root: Path | None = None) -> dict[str, object] | None:
    """The stamp of a finished install with ``spec``'s requirements, else None."""
    path = venv_dir(spec, root) / STAMP
    try:
        stamp = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("requirements") != list(spec.requirements):
        return None
    if stamp.get("left_out") != list(LEFT_OUT):
        return None
    return stamp if venv_python(spec, root).exists() else None


def install(spec: RuntimeSpec | PeerSpec, root: Path) -> dict[str, object]:
    """Create ``spec``'s venv under ``root`` unless its stamp says it is there; the stamp."""
    stamp = read_stamp(spec, root)
    if stamp is not None:
        print(f"{spec.folder_name}: installed ({' '.join(spec.requirements)}), nothing to do")
        return stamp
    target = venv_dir(spec, root)
    if target.exists():
        print(f"{spec.folder_name}: incomplete or other requirements, making it again")
        shutil.rmtree(target)
    _check_free_disk(spec, root)
    print(f"{spec.folder_name}: installing {' '.join(spec.requirements)} into {target}")
    start = time.monotonic()
    venv.create(target, with_pip=True)
    python = str(venv_python(spec, root))
    # The pins first without their requirements, then those requirements but LEFT_OUT (pip then
    # resolves everything below them as usual).
    _pip(python, "--no-deps", *spec.requirements)
    requirements = _requirements_of(python, spec.requirements)
    if requirements:
        _pip(python, *requirements)
    print(f"{spec.folder_name}: left out on purpose: {', '.join(LEFT_OUT)} (pip may warn of it)")
    frozen = subprocess.run(
        [python, "-m", "pip", "freeze", "--all"], check=True, capture_output=True, text=True
    ).stdout.split()
    stamp = {
        "requirements": list(spec.requirements),
        "left_out": list(LEFT_OUT),
        "installed": frozen,
        "seconds": round(time.monotonic() - start, 1),
        "bytes": _disk_bytes(target),
    }
    (target / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    print(
        f"{spec.folder_name}: done in {stamp['seconds']} s, {_gib(int(stamp['bytes']))} on disk"  # type: ignore[call-overload]
    )
    return stamp


def _pip(python: str, *args: str) -> None:
    # No wheel cache: the venv is the cache, and a second copy of a CUDA torch is gigabytes.
    subprocess.run(
        [python, "-m", "pip", "install", "--no-cache-dir", "--progress-bar", "off", *args],
        check=True,
    )


# Run in the new venv: the requirements of the named installed packages that apply there
# (markers evaluated by pip's own vendored packaging), one per line, markers dropped.
_LIST_REQUIREMENTS = """
import sys
from importlib import metadata
from pip._vendor.packaging.requirements import Requirement
for name in sys.argv[1:]:
    for line in metadata.requires(name) or ():
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            extras = "[" + ",".join(sorted(req.extras)) + "]" if req.extras else ""
            print(f"{req.name}{extras}{req.specifier}")
"""


def _requirements_of(python: str, pins: tuple[str, ...]) -> list[str]:
    names = [pin.split("==")[0] for pin in pins]
    listed = subprocess.run(
        [python, "-c", _LIST_REQUIREMENTS, *names], check=True, capture_output=True, text=True
    ).stdout.split()
    skip = {_normalized(n) for n in (*names, *LEFT_OUT)}
    wanted = [r for r in listed if _normalized(_name_of(r)) not in skip]
    return sorted(set(wanted))


def _name_of(requirement: str) -> str:
    for i, ch in enumerate(requirement):
        if not (ch.isalnum() or ch in "-_."):
            return requirement[:i]
    return requirement


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


class NotEnoughDiskError(Exception):
    """Too little free disk for a venv: refused before pip starts, with the figures."""


def _check_free_disk(spec: RuntimeSpec | PeerSpec, root: Path) -> None:
    needed = spec.disk_gib + DOWNLOAD_HEADROOM_GIB
    free = shutil.disk_usage(root).free / 2**30
    if free < needed:
        raise NotEnoughDiskError(
            f"install.py: {spec.folder_name} needs about {needed:.1f} GiB free under {root} "
            f"({spec.disk_gib} GiB installed, {DOWNLOAD_HEADROOM_GIB} GiB while pip downloads); "
            f"{free:.1f} GiB are. Free some, or install elsewhere: "
            f"python fxmobile/runtime/install.py /bigger/disk/runtimes, then "
            f"{DIR_VARIABLE}=/bigger/disk/runtimes"
        )


def _disk_bytes(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def main(argv: list[str]) -> int:
    """Install the runtimes named in ``argv`` (``make runtimes``); the exit status."""
    if sys.version_info[:2] > NEWEST_PYTHON:
        print(
            f"install.py: torch 1.13.1 has no wheel for Python "
            f"{sys.version_info.major}.{sys.version_info.minor}; run it with Python "
            f"{NEWEST_PYTHON[0]}.{NEWEST_PYTHON[1]} (make runtimes PYTHON=python3.11)",
            file=sys.stderr,
        )
        return 2
    flags = {a for a in argv if a.startswith("--")}
    unknown = flags - {"--peers", "--if-room"}
    if unknown:
        print(f"install.py: unknown option {sorted(unknown)[0]}; [--peers] [--if-room] [DIR]")
        return 2
    folders = [a for a in argv if a not in flags]
    root = Path(folders[0]) if folders else default_dir()
    root.mkdir(parents=True, exist_ok=True)
    for spec in (PEERS if "--peers" in flags else RUNTIMES).values():
        try:
            install(spec, root)
        except NotEnoughDiskError as error:
            print(error, file=sys.stderr)
            if "--if-room" not in flags:
                return 3
            # CI on a machine short of disk: the unit tests still run, the runtime tests say
            # they skipped (pytest's header names the missing runtimes).
            print(f"install.py: --if-room: {spec.folder_name} skipped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
