"""The zoo on ExecuTorch (``--runtime executorch``) as a table and as counts per kind.

Each row sets fxmobile's program beside ExecuTorch's own of the same weights: whether each went
through and matched eager, its delegate calls and the op calls it left on portable kernels, its
size and the seconds it took to make, and, with timed rounds, median / p10 ms of both programs
(this process's ExecuTorch runtime, XNNPACK) and of eager (torch here, ATen).

The counts per kind add delegate calls and portable ops over the models both flows made a
program of (sums over different models would compare nothing), and list each model on which
fxmobile is not strictly better: its program fails where ExecuTorch's own goes through, makes
more delegate calls or leaves more portable ops, or merely ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from fxmobile.api import EXECUTORCH as TARGET
from model_zoo_checks.results import EXECUTORCH, FXMOBILE, ModelResult, ProgramRecord

OURS, THEIRS = "fxmobile", "ExecuTorch's own"  # how the table and the counts name the flows
HEADERS = [
    "model",
    f"{OURS} program",
    f"{THEIRS} program",
    "delegate calls fxm / ET",
    "portable ops fxm / ET",
    "MiB fxm / ET",
    "make s fxm / ET",
]
# With timed rounds: median / p10 ms at batch 1; the programs in ExecuTorch's runtime here.
TIMED_HEADERS = [
    "eager ms (torch, ATen)",
    "fxm ms (ExecuTorch, XNNPACK)",
    "ET ms (ExecuTorch, XNNPACK)",
]


def on_executorch(results: Sequence[ModelResult]) -> bool:
    """Whether ``results`` come from a ``--runtime executorch`` run."""
    return any(r.target_runtime == TARGET for r in results)


def render_programs_table(results: Sequence[ModelResult], fmt: str = "simple") -> str:
    """One row per model: the two flows' programs side by side (see the module docstring);
    the latency columns only when some model was timed."""
    timed = any(p.median_ms is not None for r in results for p in r.programs.values())
    rows = [_row(r) + (_timed_cells(r) if timed else []) for r in results]
    headers = HEADERS + (TIMED_HEADERS if timed else [])
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def _row(r: ModelResult) -> list[Any]:
    ours, theirs = r.programs.get(FXMOBILE), r.programs.get(EXECUTORCH)
    if ours is None or theirs is None:  # not run (unsupported, skipped) or the check raised
        return [r.key, f"{r.status.value}: {r.error or ''}", "", "", "", "", ""]
    return [
        r.key,
        _verdict(ours),
        _verdict(theirs),
        _pair(ours.delegate_calls, theirs.delegate_calls),
        _pair(ours.portable_ops, theirs.portable_ops),
        _pair(_mib(ours.nbytes), _mib(theirs.nbytes)),
        _pair(_fixed(ours.seconds), _fixed(theirs.seconds)),
    ]


def _timed_cells(r: ModelResult) -> list[str]:
    ours, theirs = r.programs.get(FXMOBILE), r.programs.get(EXECUTORCH)
    return [
        _times(r.eager_ms, r.eager_p10_ms),
        "" if ours is None else _times(ours.median_ms, ours.p10_ms),
        "" if theirs is None else _times(theirs.median_ms, theirs.p10_ms),
    ]


def _verdict(record: ProgramRecord) -> str:
    if record.through:
        error = "" if record.relative_error is None else f" {record.relative_error:.0e}"
        return f"{record.verdict}{error}"
    return record.verdict.upper()


def _pair(ours: object, theirs: object) -> str:
    return f"{'-' if ours is None else ours} / {'-' if theirs is None else theirs}"


def _mib(nbytes: int | None) -> str | None:
    return None if nbytes is None else f"{nbytes / 2**20:.1f}"


def _fixed(seconds: float | None) -> str | None:
    return None if seconds is None else f"{seconds:.1f}"


def _times(median: float | None, p10: float | None) -> str:
    if median is None:
        return ""
    return f"{median:.2f} / {'-' if p10 is None else f'{p10:.2f}'}"


def program_counts(results: Sequence[ModelResult]) -> list[str]:
    """Per kind, in the order the kinds first appear: through, matched, delegate calls and
    portable ops of both flows, then one line per model fxmobile is not strictly better on,
    and one per model ExecuTorch's own flow did not take."""
    lines = []
    for kind in dict.fromkeys(r.kind for r in results):
        checked = [r for r in results if r.kind == kind and _both(r)]
        if not checked:
            continue
        ours = [r.programs[FXMOBILE] for r in checked]
        theirs = [r.programs[EXECUTORCH] for r in checked]
        both = [(o, t) for o, t in zip(ours, theirs, strict=True) if o.through and t.through]
        n = len(checked)
        lines.append(
            f"{kind} ({n} model{'s' if n != 1 else ''}), {OURS} / {THEIRS}: "
            f"through {sum(p.through for p in ours)} / {sum(p.through for p in theirs)}, "
            f"matched {sum(p.passed for p in ours)} / {sum(p.passed for p in theirs)}; "
            f"on the {len(both)} both made: "
            f"delegate calls {_sum(o.delegate_calls for o, _ in both)} / "
            f"{_sum(t.delegate_calls for _, t in both)}, "
            f"portable ops {_sum(o.portable_ops for o, _ in both)} / "
            f"{_sum(t.portable_ops for _, t in both)}"
        )
        worse = [(r.key, why) for r in checked if (why := not_strictly_better(r)) is not None]
        lines.append(
            f"  {OURS} not strictly better on {len(worse)} of {n}" + (":" if worse else "")
        )
        lines += [f"    {key}: {why}" for key, why in worse]
        lines += [
            f"    {THEIRS} flow did not go through on {r.key}: "
            f"{_short(r.programs[EXECUTORCH].error)}"
            for r in checked
            if not r.programs[EXECUTORCH].through
        ]
    return lines


def not_strictly_better(result: ModelResult) -> str | None:
    """Why fxmobile's program is not strictly better than ExecuTorch's own, or None when it
    is: it matched eager, and either the other flow made no matching program, or fxmobile's
    makes no more delegate calls and leaves no more portable ops, and fewer of one."""
    ours, theirs = result.programs[FXMOBILE], result.programs[EXECUTORCH]
    if not ours.passed:
        where = (
            f"fails where {THEIRS} flow goes through"
            if theirs.passed
            else "neither flow made a program that matches eager"
        )
        return f"{where}: {_short(ours.error)}"
    if not theirs.passed:
        return None
    d_ours, d_theirs = ours.delegate_calls or 0, theirs.delegate_calls or 0
    p_ours, p_theirs = ours.portable_ops or 0, theirs.portable_ops or 0
    left = _ops(ours.portable_by_op)
    worse = []
    if d_ours > d_theirs:
        worse.append(f"more delegate calls ({d_ours} vs {d_theirs})")
    if p_ours > p_theirs:
        worse.append(f"more portable ops ({p_ours} vs {p_theirs}; fxmobile leaves {left})")
    if worse:
        return "; ".join(worse)
    if (d_ours, p_ours) == (d_theirs, p_theirs):
        tie = f"same counts: {d_ours} delegate call(s), {p_ours} portable op(s)"
        return tie + (f" ({left})" if p_ours else "")
    return None


def _short(error: str | None, limit: int = 160) -> str:
    """An error cut for a summary line (an FX node's meta can make its first line long); the
    JSON keeps it whole."""
    text = error or ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _both(r: ModelResult) -> bool:
    return FXMOBILE in r.programs and EXECUTORCH in r.programs


def _sum(values: Any) -> int:
    return sum(v or 0 for v in values)


def _ops(by_op: dict[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in sorted(by_op.items(), key=lambda x: -x[1]))
