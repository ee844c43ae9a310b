"""The run's results as a terminal table, a Markdown page, a JSON file and a speedup plot."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from model_zoo_checks.baseline import Regression
from model_zoo_checks.output_executorch import on_executorch, program_counts, render_programs_table
from model_zoo_checks.results import ModelResult, Status

HEADERS = [
    "model",
    "backend",
    "route",
    "status",
    "rel. error",
    "top-5",
    "unfused",
    "file MiB",
    "optimize s",
    "eager ms",
    "optimized ms",
    "speedup",
]
# With --runtime: the file on each reference runtime, and the interleaved latency run on 2.12.1.
RUNTIME_HEADERS = [
    "2.12.1 ms: eager (2.15, ATen)",
    "fxmobile file (2.12.1, XNNPACK)",
    "upstream file (2.12.1, XNNPACK)",
    "fxmobile / upstream",
]


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _row(r: ModelResult) -> list[Any]:
    ratio = r.latency_ratio
    return [
        r.key,
        r.backend,
        r.route,
        r.status.value,
        _num(r.relative_error, ".1e"),
        "" if r.top5_match is None else ("same" if r.top5_match else "DIFFERS"),
        "" if r.unfused_ops is None else r.unfused_ops,
        _num(None if r.file_bytes is None else r.file_bytes / 2**20, ".1f"),
        _num(r.optimize_seconds, ".1f"),
        _num(r.eager_ms, ".1f"),
        _num(r.optimized_ms, ".1f"),
        "" if not ratio else f"{1 / ratio:.2f}x",
    ]


def _runtime_cells(r: ModelResult, versions: Sequence[str]) -> list[Any]:
    cells: list[Any] = []
    for version in versions:
        record = r.runtimes.get(version)
        if record is None:
            cells.append("")
        elif record.passed:
            cells.append(f"ok {_num(record.relative_error, '.0e')}")
        else:
            cells.append(record.verdict.upper())
    ms = r.runtime_ms
    ratio = r.runtime_ratio
    cells += [
        _num(ms.get("eager"), ".1f"),
        _num(ms.get("fxmobile"), ".1f"),
        _num(ms.get("upstream"), ".1f"),
        "" if ratio is None else f"{ratio:.2f}",
    ]
    return cells


def runtime_versions_of(results: Sequence[ModelResult]) -> list[str]:
    """The reference runtimes any result was checked on, sorted (a table column each)."""
    return sorted({v for r in results for v in r.runtimes})


def render_table(results: Sequence[ModelResult], fmt: str = "simple") -> str:
    """One row per result; with runtime records, a column per runtime (the file's verdict and
    relative error there) and the 2.12.1 latency run (each header names runtime and kernels).
    Latency columns are medians in ms, batch 1; eager and optimized ran here, torch 2.15, on
    ATen and on fxmobile._C. Results of ``--runtime executorch`` have a table of their own
    (``output_executorch.render_programs_table``)."""
    if on_executorch(results):
        return render_programs_table(results, fmt)
    versions = runtime_versions_of(results)
    if not versions:
        return tabulate([_row(r) for r in results], headers=HEADERS, tablefmt=fmt)
    rows = [_row(r) + _runtime_cells(r, versions) for r in results]
    headers = HEADERS + [f"on {v}" for v in versions] + RUNTIME_HEADERS
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def runtime_counts(results: Sequence[ModelResult]) -> list[str]:
    """Per runtime: how many files loaded and how many matched eager, of those checked; with
    ExecuTorch programs, the counts of both flows per kind (``output_executorch``)."""
    lines = program_counts(results)
    for version in runtime_versions_of(results):
        records = [r.runtimes[version] for r in results if version in r.runtimes]
        loads = sum(record.loads for record in records)
        passed = sum(record.passed for record in records)
        lines.append(
            f"torch {version}: {loads}/{len(records)} files load, {passed}/{len(records)} match "
            f"eager"
        )
    return lines


def render_problems(results: Sequence[ModelResult]) -> list[str]:
    """One line per result that failed or raised, with its error; results not run are grouped
    by reason (the whole detectors share one)."""
    lines = [
        f"{r.id}: {r.status.value}: {r.error}" for r in results if r.status.ran and not r.passed
    ]
    lines += [
        f"{r.id} on torch {v}: {record.verdict}: {record.error or 'outputs differ from eager'}"
        for r in results
        for v, record in sorted(r.runtimes.items())
        if not record.passed
    ]
    not_run: dict[tuple[Status, str], list[str]] = {}
    for r in results:
        if not r.status.ran:
            not_run.setdefault((r.status, r.error or ""), []).append(r.id)
    for (status, why), ids in not_run.items():
        lines.append(f"{status.value} ({len(ids)}): {', '.join(ids)}: {why}")
    return lines


def regression_lines(regressions: Sequence[object], baseline: object, compared: bool) -> list[str]:
    """What a run says about its regressions against ``baseline`` (nothing when not compared)."""
    if regressions:
        lines = [f"\n{len(regressions)} regression(s) against {baseline}:"]
        return lines + [f"  {regression}" for regression in regressions]
    return [f"\nno regressions against {baseline}"] if compared else []


def render_markdown(
    results: Sequence[ModelResult],
    regressions: Sequence[Regression],
    meta: Mapping[str, Any],
) -> str:
    """The ``zoo.md`` page: the run's meta as a list, the results table (GitHub format, headers
    naming each latency column's runtime and kernels), the regressions, and what did not pass."""
    parts = ["# fxmobile model zoo run", ""]
    parts += [f"- {key}: {value}" for key, value in meta.items()]
    parts += _bullets(runtime_counts(results))
    parts += ["", render_table(results, "github"), "", "## Regressions against the baseline", ""]
    parts += [f"- {r}" for r in regressions] or ["None."]
    problems = render_problems(results)
    if problems:
        parts += ["", "## Not passed (errors, failed checks, unsupported, skipped)", ""]
        parts += [f"- {line}" for line in problems]
    return "\n".join(parts) + "\n"


def _bullets(lines: Sequence[str]) -> list[str]:
    """Lines indented by two spaces a level as a nested Markdown list."""
    items = []
    for line in lines:
        text = line.lstrip(" ")
        items.append("  " * ((len(line) - len(text)) // 2) + f"- {text}")
    return items


def to_json(
    results: Sequence[ModelResult],
    regressions: Sequence[Regression],
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``zoo.json`` document: meta, results and regressions as JSON-ready data (what
    ``python -m model_zoo_checks merge`` reads back)."""
    return {
        "meta": dict(meta),
        "results": [r.to_dict() for r in results],
        "regressions": [r.to_dict() for r in regressions],
    }


def write_outputs(
    out_dir: Path,
    results: Sequence[ModelResult],
    regressions: Sequence[Regression],
    meta: Mapping[str, Any],
) -> list[Path]:
    """``zoo.json`` and ``zoo.md`` in ``out_dir`` (created); the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "zoo.json", out_dir / "zoo.md"
    json_path.write_text(json.dumps(to_json(results, regressions, meta), indent=1) + "\n")
    md_path.write_text(render_markdown(results, regressions, meta))
    return [json_path, md_path]


def plot_speedups(results: Sequence[ModelResult], path: Path) -> str:
    """A bar chart of eager/optimized latency per model (PNG); a message saying what happened."""
    timed = [r for r in results if r.latency_ratio]
    if not timed:
        return "no plot: no model was timed (latency is measured on the CPU with --rounds > 0)"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    speedups = [1 / r.latency_ratio for r in timed if r.latency_ratio]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(timed)), 4.5))
    ax.bar(range(len(timed)), speedups)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(timed)), [r.id for r in timed], rotation=90, fontsize=7)
    ax.set_ylabel("speedup (eager / optimized median latency)")
    ax.set_title("fxmobile: per-model speedup, batch 1")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot written to {path}"
