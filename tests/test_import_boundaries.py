"""The floors of fxmobile, kept: no module imports one on a floor above its own, shared code never
imports a backend, and no backend imports another.

    foundation (errors, options, infra, ops, progress, report, timing, verify)
      <- capture <- passes <- script <- backends <- runtime <- executorch <- api <- cli, the
      package itself

A module may import its own floor and every floor below it; imports inside functions count too
(they are how an upward import hides). ``model_zoo_checks`` and ``benchmarks`` stand on top and
are never imported by the package. ``backends/registry.py`` is the backends' index: it alone
imports each backend's spec, so that nothing else has to.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fxmobile"

FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "options", "infra", "ops", "progress", "report", "timing", "verify"}),
    frozenset({"capture"}),
    frozenset({"passes"}),
    frozenset({"script"}),
    frozenset({"backends"}),
    frozenset({"runtime"}),
    frozenset({"executorch"}),
    frozenset({"api"}),
    frozenset({"cli", "__init__", "__main__"}),
)
BACKENDS = ("xnnpack", "vulkan", "metal")
INDEX = "fxmobile.backends.registry"


def floor(unit: str) -> int:
    for level, units in enumerate(FLOORS):
        if unit in units:
            return level
    raise AssertionError(f"fxmobile.{unit} is on no floor: add it to FLOORS in {__file__}")


def unit_of(module: str) -> str:
    """``fxmobile.script.freeze`` -> ``script``; ``fxmobile`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def backend_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "backends" and parts[2] in BACKENDS else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, fxmobile module) for every import of the package or of the top-level tools."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "fxmobile":  # from fxmobile import ops: the submodule, if it is one
                found += [
                    (node.lineno, f"fxmobile.{a.name}")
                    if (PACKAGE / a.name).exists() or (PACKAGE / f"{a.name}.py").exists()
                    else (node.lineno, "fxmobile")
                    for a in node.names
                ]
            else:
                found.append((node.lineno, node.module))
    tops = ("fxmobile", "model_zoo_checks", "benchmarks")
    return [(line, name) for line, name in found if name.split(".")[0] in tops]


def violations(path: Path) -> list[str]:
    here = module_name(path)
    out = []
    for line, target in imports(path):
        where = f"{path.relative_to(ROOT)}:{line} imports {target}"
        if target.split(".")[0] != "fxmobile":
            out.append(f"{where}: the package never imports the tools above it")
            continue
        mine, theirs = unit_of(here), unit_of(target)
        if mine == "__init__" and here != "fxmobile":
            mine = here.split(".")[1]
        if floor(theirs) > floor(mine):
            out.append(f"{where}: {theirs} is above {mine}")
        if backend_of(target) and backend_of(here) not in (None, backend_of(target)):
            out.append(f"{where}: a backend never imports another")
        if backend_of(target) and mine == "backends" and backend_of(here) is None and here != INDEX:
            out.append(f"{where}: what backends share never imports one of them")
    return out


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_no_import_climbs_a_floor(path: Path) -> None:
    assert violations(path) == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    fake = PACKAGE / "passes" / "_boundary_probe.py"
    source = "def f():\n    from fxmobile.backends.xnnpack import pipeline\n"
    fake.write_text(source)
    try:
        found = violations(fake)
    finally:
        fake.unlink()
    assert found == [
        "fxmobile/passes/_boundary_probe.py:2 imports fxmobile.backends.xnnpack: "
        "backends is above passes"
    ]
