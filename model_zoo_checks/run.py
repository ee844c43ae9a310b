"""The zoo regression run: ``python -m model_zoo_checks [selection] [options]``.

Selects models from the catalogue, checks each on the chosen backends (and with ``--runtime``
on the real mobile runtimes), prints a table, writes Markdown and JSON (``--out``), compares
with the committed baseline and exits 1 when something regressed (see
``model_zoo_checks.baseline`` for what counts; a latency regression is confirmed by timing the
model again alone, ``model_zoo_checks.confirm``). ``--update-baseline`` merges this run's
results into the baseline instead of failing.

``--runtime executorch`` makes no lite-interpreter file: each model becomes an ExecuTorch
program for XNNPACK by fxmobile's flow and by ExecuTorch's own (``model_zoo_checks.on_executorch``),
against a baseline of its own (``baseline-executorch.json``).

``--shard I/N`` runs every N-th model of the selection starting at the I-th, so N machines
cover it; ``python -m model_zoo_checks merge DIR/zoo.json ...`` (``model_zoo_checks.merge``)
joins their JSON into one table and one baseline check.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from fxmobile import Backend
from fxmobile.api import EXECUTORCH
from fxmobile.cli.common import blocklist_member
from fxmobile.runtime import RUNTIMES, RuntimeNotInstalledError, require_installed
from model_zoo_checks import baseline as baseline_io
from model_zoo_checks import ecosystem
from model_zoo_checks.confirm import confirm_latency
from model_zoo_checks.journal import JOURNAL, Journal
from model_zoo_checks.on_runtimes import runtime_versions
from model_zoo_checks.output import (
    plot_speedups,
    regression_lines,
    render_problems,
    render_table,
    runtime_counts,
    write_outputs,
)
from model_zoo_checks.runner import RunOptions, check_model, quiet_warnings, run_zoo
from model_zoo_checks.zoo import OPT_IN_KINDS, Kind, ZooModel, all_models, quick_models


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m model_zoo_checks``; threshold defaults come from
    ``baseline.Thresholds``."""
    p = argparse.ArgumentParser(
        prog="python -m model_zoo_checks",
        description="Run fxmobile over torchvision's model zoo and compare with the baseline.",
        epilog="Exit status: 0 clean, 1 a regression against the baseline, 2 bad arguments.",
    )
    sel = p.add_argument_group("selection (filters combine: a model must match each given)")
    sel.add_argument("--models", nargs="+", metavar="NAME", help="names or keys (name@HxW)")
    sel.add_argument("--family", nargs="+", metavar="NAME", help="e.g. resnet mobilenet vit")
    sel.add_argument(
        "--kind",
        nargs="+",
        choices=[k.value for k in Kind],
        help="timm and ecosystem run only when named here (or by model name)",
    )
    sel.add_argument(
        "--quick", action="store_true", help="the small fixed subset at small inputs (~1 min)"
    )
    sel.add_argument("--skip-giants", action="store_true", help="skip vit_h_14, regnet_y_128gf")
    sel.add_argument(
        "--include-unsupported",
        action="store_true",
        help="also try the entries the catalogue marks unsupported (whole detectors)",
    )
    sel.add_argument("--list", action="store_true", help="print the selected catalogue and exit")
    run = p.add_argument_group("running")
    run.add_argument("--backend", nargs="+", default=["cpu"], choices=[b.value for b in Backend])
    run.add_argument(
        "--rounds", type=int, default=3, metavar="N", help="timed rounds at least (0: none)"
    )
    run.add_argument(
        "--min-time",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="fast models get more rounds, up to this much timing (default 1 s)",
    )
    run.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed rounds first")
    run.add_argument(
        "--threads", type=int, default=2, metavar="N", help="torch threads (default 2)"
    )
    run.add_argument(
        "--blocklist",
        nargs="+",
        default=[],
        type=blocklist_member,
        metavar="MEMBER",
        help="MobileOptimizerType members to switch off, e.g. HOIST_CONV_PACKED_PARAMS",
    )
    run.add_argument(
        "--isolate", action="store_true", help="every model in its own guarded process"
    )
    run.add_argument(
        "--runtime",
        choices=[*RUNTIMES, "all", EXECUTORCH],
        metavar="RUNTIME",
        help="1.13.1, 2.12.1 or all: also load and run each CPU file on this reference runtime "
        "(`make runtimes` installs them); on 2.12.1, time it against upstream's "
        "optimize_for_mobile file and eager. executorch: instead of the lite-interpreter file, "
        "make each model's ExecuTorch program for XNNPACK with fxmobile "
        "(target_runtime='executorch') and with ExecuTorch's own flow (export, "
        "to_edge_transform_and_lower, XnnpackPartitioner), run both in ExecuTorch's runtime "
        "against eager and count their delegate calls and portable ops (with --rounds, time "
        "both and eager); CPU only, compared with model_zoo_checks/baseline-executorch.json",
    )
    run.add_argument(
        "--shard",
        type=shard,
        metavar="I/N",
        help="run the I-th of N deterministic slices of the selection (1 <= I <= N); "
        "join the shards' --out JSON with `python -m model_zoo_checks merge`",
    )
    run.add_argument(
        "--memory-limit",
        type=float,
        default=20.0,
        metavar="GIB",
        help="a child process (giants, --isolate) is killed above this resident memory",
    )
    run.add_argument(
        "--timeout", type=float, default=1800.0, metavar="SECONDS", help="per child process"
    )
    base = p.add_argument_group("baseline")
    base.add_argument(
        "--baseline",
        type=Path,
        metavar="JSON",
        help="default: model_zoo_checks/baseline.json (--runtime executorch: "
        "model_zoo_checks/baseline-executorch.json)",
    )
    base.add_argument(
        "--update-baseline",
        action="store_true",
        help="merge this run's results into the baseline (selected models only); exit 0",
    )
    base.add_argument("--no-compare", action="store_true", help="do not compare (exit 0)")
    limits = baseline_io.Thresholds()
    base.add_argument(
        "--latency-margin",
        type=float,
        default=limits.latency_margin,
        metavar="FRACTION",
        help="allowed growth of optimized/eager latency ratio (default 0.25 = 25%%)",
    )
    base.add_argument(
        "--error-growth",
        type=float,
        default=limits.error_growth,
        metavar="FACTOR",
        help="allowed growth factor of the relative error (default 10)",
    )
    base.add_argument(
        "--error-floor",
        type=float,
        default=limits.error_floor,
        metavar="FRACTION",
        help="errors below this fraction of the tolerance never regress (default 0.1)",
    )
    out = p.add_argument_group("output")
    out.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write zoo.json and zoo.md here, and each model's results to journal.jsonl as "
        "soon as they are in",
    )
    out.add_argument(
        "--resume",
        action="store_true",
        help="with --out: take the models already in DIR/journal.jsonl from there (a run that "
        "was killed goes on where it stopped)",
    )
    out.add_argument("--plot", type=Path, metavar="PNG", help="per-model speedup bar chart")
    return p


def select(
    entries: Sequence[ZooModel],
    models: Sequence[str] | None = None,
    families: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
) -> list[ZooModel]:
    """The entries matching every given filter; unknown model names raise ``KeyError``. The
    opt-in kinds (``OPT_IN_KINDS``) only when ``kinds`` or ``models`` selects them."""
    if models:
        known = {e.key for e in entries} | {e.name for e in entries}
        unknown = [m for m in models if m not in known]
        if unknown:
            hints = {m: difflib.get_close_matches(m, known, n=3) for m in unknown}
            raise KeyError(
                "unknown model(s): "
                + "; ".join(
                    f"{m} (did you mean {', '.join(h)}?)" if h else m for m, h in hints.items()
                )
            )
    return [
        e
        for e in entries
        if (not models or e.key in models or e.name in models)
        and (not families or e.family in families)
        and (e.kind in kinds if kinds else bool(models) or e.kind not in OPT_IN_KINDS)
    ]


def _catalogue(entries: Sequence[ZooModel]) -> str:
    rows = [
        [
            e.key,
            e.kind.value,
            e.family,
            "x".join(map(str, e.input_shape)),
            e.route.value,
            "giant" if e.giant else "",
            e.unsupported or "",
        ]
        for e in entries
    ]
    headers = ["model", "kind", "family", "input", "route", "", "unsupported: why"]
    return tabulate(rows, headers=headers, maxcolwidths=[None] * 6 + [70])


def shard(text: str) -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)``, 1 <= I <= N."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not I/N, e.g. 2/4") from None
    if not 1 <= index <= count:
        raise argparse.ArgumentTypeError(f"shard {text}: I must be between 1 and N")
    return index, count


def shard_of(entries: Sequence[ZooModel], index: int, count: int) -> list[ZooModel]:
    """Every ``count``-th entry from the ``index``-th (1-based): the shards of a selection are
    disjoint, cover it, and interleave the catalogue's big and small families."""
    return list(entries[index - 1 :: count])


def main(argv: Sequence[str] | None = None) -> int:
    """The zoo run (``argv`` defaults to ``sys.argv[1:]``; ``merge ...`` goes to
    ``model_zoo_checks.merge``); returns the exit status.

    0 clean (or ``--list``, ``--no-compare``, ``--update-baseline``), 1 a confirmed regression,
    2 bad arguments: an unknown model, an empty selection, a package an ecosystem model needs or
    a reference runtime not installed,
    ``--resume`` without ``--out``, ``--runtime executorch`` with a GPU backend or without
    ExecuTorch installed, a baseline of the other kind of run.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        from model_zoo_checks.merge import main as merge_main

        return merge_main(argv[1:])
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        entries = select(
            quick_models() if args.quick else all_models(), args.models, args.family, args.kind
        )
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.shard:
        entries = shard_of(entries, *args.shard)
    if args.list:
        print(_catalogue(entries))
        return 0
    if not entries:
        print("error: no model matches the selection (see --list)", file=sys.stderr)
        return 2
    missing = ecosystem.missing_packages(entries)
    if missing:
        print(
            f"error: the ecosystem models selected need {', '.join(missing)}: {ecosystem.INSTALL}",
            file=sys.stderr,
        )
        return 2
    executorch = args.runtime == EXECUTORCH
    refusal = _refuse_executorch(args) if executorch else None
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    args.baseline = args.baseline or baseline_io.default_path(executorch)
    options = RunOptions(
        backends=tuple(Backend(b) for b in dict.fromkeys(args.backend)),
        rounds=args.rounds,
        min_time=args.min_time,
        warmup=args.warmup,
        threads=args.threads,
        blocklist=frozenset(args.blocklist),
        skip_giants=args.skip_giants,
        include_unsupported=args.include_unsupported,
        isolate=args.isolate,
        memory_limit_gib=args.memory_limit,
        timeout=args.timeout,
        runtimes=() if executorch else runtime_versions(args.runtime),
        executorch=executorch,
    )
    for version in options.runtimes:
        try:
            require_installed(version)
        except RuntimeNotInstalledError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    thresholds = baseline_io.Thresholds(
        error_growth=args.error_growth,
        error_floor=args.error_floor,
        latency_margin=args.latency_margin,
    )
    if args.resume and not args.out:
        print("error: --resume needs --out (the journal is DIR/journal.jsonl)", file=sys.stderr)
        return 2
    try:
        old = baseline_io.load(args.baseline, executorch)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    journal = Journal(args.out / JOURNAL if args.out else None, args.resume, executorch)
    done = journal.results_for(entries)
    todo = [e for e in entries if e.key not in journal.keys]
    if journal.keys:
        print(f"resuming: {len(entries) - len(todo)} model(s) from {journal.path}")
    start = time.monotonic()
    with quiet_warnings():
        fresh = run_zoo(todo, options, on_model=journal.append)
    seconds = time.monotonic() - start
    results = [r for e in entries for r in (*done, *fresh) if r.key == e.key]  # catalogue order

    regressions: list[baseline_io.Regression] = []
    not_confirmed: list[str] = []
    if not args.no_compare:
        confirmed = confirm_latency(results, old, thresholds, entries, options, check_model)
        results, regressions = confirmed.results, confirmed.regressions
        not_confirmed = confirmed.not_confirmed
        for line in not_confirmed:
            print(f"  {line}")
    print(render_table(results))
    for line in render_problems(results) + runtime_counts(results):
        print(f"  {line}")
    new = baseline_io.not_in_baseline(results, old)
    if new and not args.update_baseline and not args.no_compare:
        print(f"not in the baseline (not compared): {', '.join(new)}")
    for line in regression_lines(regressions, args.baseline, not args.no_compare):
        print(line)

    meta = _meta(args, options, thresholds, seconds)
    meta["latency_not_confirmed"] = not_confirmed
    if args.out:
        for path in write_outputs(args.out, results, regressions, meta):
            print(f"wrote {path}")
    if args.plot:
        print(plot_speedups(results, args.plot))
    if args.update_baseline:
        baseline_io.save(baseline_io.merged(old, results), args.baseline)
        print(f"baseline {args.baseline} updated for {len(entries)} model(s)")
        return 0
    return 1 if regressions else 0


def _refuse_executorch(args: argparse.Namespace) -> str | None:
    """Why ``--runtime executorch`` cannot run with these arguments, or None."""
    import fxmobile.executorch

    if set(args.backend) != {Backend.CPU.value}:
        return (
            f"--runtime executorch makes programs for XNNPACK, a CPU delegate: drop "
            f"--backend {' '.join(args.backend)} (or run the GPU backends without it)"
        )
    if not fxmobile.executorch.available():
        hint = fxmobile.executorch.INSTALL_HINT
        return f"--runtime executorch needs ExecuTorch, which is not installed: {hint}"
    return None


def _meta(
    args: argparse.Namespace,
    options: RunOptions,
    thresholds: baseline_io.Thresholds,
    seconds: float,
) -> dict[str, Any]:
    import torch
    import torchvision

    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cpus": os.cpu_count(),
        "command": " ".join(["python -m model_zoo_checks", *args.argv]),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "backends": [b.value for b in options.backends],
        "rounds": options.rounds,
        "min_time": options.min_time,
        "warmup": options.warmup,
        "threads": options.threads,
        "blocklist": sorted(m.name for m in options.blocklist),
        "runtimes": [EXECUTORCH] if options.executorch else list(options.runtimes),
        "shard": None if args.shard is None else "/".join(map(str, args.shard)),
        "thresholds": vars(thresholds),
        "baseline": str(args.baseline),
        "seconds": round(seconds, 1),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }
