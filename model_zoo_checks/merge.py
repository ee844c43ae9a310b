"""``python -m model_zoo_checks merge SHARD.json... [--out DIR]``: the shards of one zoo run
(``--shard I/N``, each with ``--out``) as one table and one baseline check.

The shards must come from one selection: the same N, each I once, and no model twice; a
missing shard is named and fails the merge (its models were not checked). Each shard confirmed
its own latency regressions (it timed the flagged models again alone), so the merged results
carry the confirmed figures and are compared with the baseline as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model_zoo_checks import baseline as baseline_io
from model_zoo_checks.output import (
    regression_lines,
    render_problems,
    render_table,
    runtime_counts,
    write_outputs,
)
from model_zoo_checks.output_executorch import on_executorch
from model_zoo_checks.results import ModelResult


class MergeError(ValueError):
    """Shards that do not make one run: the message names the files and what is wrong."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m model_zoo_checks merge``."""
    p = argparse.ArgumentParser(
        prog="python -m model_zoo_checks merge",
        description="Join the zoo.json of the shards of one run (--shard I/N) into one table "
        "and one baseline check.",
        epilog="Exit status: 0 clean, 1 a regression or a missing shard, 2 bad arguments.",
    )
    p.add_argument("shards", nargs="+", type=Path, metavar="ZOO_JSON")
    p.add_argument("--out", type=Path, metavar="DIR", help="write the merged zoo.json and zoo.md")
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="JSON",
        help="default: model_zoo_checks/baseline.json (shards of --runtime executorch: "
        "model_zoo_checks/baseline-executorch.json)",
    )
    p.add_argument("--no-compare", action="store_true", help="do not compare (exit 0)")
    p.add_argument(
        "--update-baseline", action="store_true", help="merge the results into the baseline"
    )
    return p


def merge_shards(
    documents: Sequence[tuple[Path, dict[str, Any]]],
) -> tuple[list[ModelResult], dict[str, Any], list[str]]:
    """The shards' results in shard order, the merged meta, and the shards missing (as
    ``I/N``); ``MergeError`` when they are not shards of one run."""
    shards: dict[int, Path] = {}
    counts = set()
    for path, doc in documents:
        text = doc.get("meta", {}).get("shard")
        if not text:
            raise MergeError(f"{path}: not a shard (its run had no --shard I/N)")
        index, count = (int(part) for part in text.split("/"))
        counts.add(count)
        if index in shards:
            raise MergeError(f"{path} and {shards[index]} are both shard {text}")
        shards[index] = path
    if len(counts) != 1:
        raise MergeError(f"shards of different splits: N = {sorted(counts)}")
    (count,) = counts
    by_path = {path: doc for path, doc in documents}
    results: list[ModelResult] = []
    seen: dict[str, Path] = {}
    for index in sorted(shards):
        path = shards[index]
        for data in by_path[path]["results"]:
            result = ModelResult.from_dict(data)
            if result.id in seen:
                raise MergeError(f"{result.id} is in {seen[result.id]} and in {path}")
            seen[result.id] = path
            results.append(result)
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in shards]
    metas = [by_path[shards[i]]["meta"] for i in sorted(shards)]
    meta = {
        "merged_shards": [str(shards[i]) for i in sorted(shards)],
        "missing_shards": missing,
        "commands": [m.get("command") for m in metas],
        "dates": [m.get("date") for m in metas],
        "runtimes": sorted({v for m in metas for v in m.get("runtimes", [])}),
        "seconds": [m.get("seconds") for m in metas],
        "thresholds": metas[0].get("thresholds", {}),
        "load_average_1_5_15": [m.get("load_average_1_5_15") for m in metas],
        "latency_not_confirmed": [x for m in metas for x in m.get("latency_not_confirmed", [])],
    }
    return results, meta, missing


def main(argv: Sequence[str]) -> int:
    """Merge the shards named in ``argv``, print the table and the baseline check, and return
    the exit status: 2 when a shard cannot be read or the shards are not one run, 1 on a
    regression or a missing shard, else 0. ``--update-baseline`` writes the baseline and
    returns 0 whatever was found.
    """
    args = build_parser().parse_args(list(argv))
    try:
        documents = [(path, json.loads(path.read_text())) for path in args.shards]
        results, meta, missing = merge_shards(documents)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    executorch = on_executorch(results)
    args.baseline = args.baseline or baseline_io.default_path(executorch)
    try:
        old = baseline_io.load(args.baseline, executorch)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render_table(results))
    for line in render_problems(results) + runtime_counts(results):
        print(f"  {line}")
    thresholds = baseline_io.Thresholds(**meta["thresholds"])
    regressions = [] if args.no_compare else baseline_io.compare(results, old, thresholds)
    for line in regression_lines(regressions, args.baseline, not args.no_compare):
        print(line)
    if missing:
        print(f"missing shard(s) {', '.join(missing)}: their models were not checked")
    if args.out:
        for path in write_outputs(args.out, results, regressions, meta):
            print(f"wrote {path}")
    if args.update_baseline:
        baseline_io.save(baseline_io.merged(old, results), args.baseline)
        print(f"baseline {args.baseline} updated for {len(results)} result(s)")
        return 0
    return 1 if regressions or missing else 0
