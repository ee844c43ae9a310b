"""The mutation score of each mutated module, from mutmut's results in mutants/ (`make mutants`).

A mutant is caught when its tests failed, timed out or crashed; missed when they passed or no
test reached it. Modules whose mutants have not run yet say how many are left; the score is over
the mutants that ran.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code  # mutmut's own reading of a mutant's exit code

CAUGHT = "caught"
_CAUGHT_STATUSES = {"killed", "timeout", "segfault"}


def verdict(code: int | None) -> str:
    """caught, not run, or mutmut's status of a missed mutant (survived, no tests, ...)."""
    status = status_by_exit_code[code]
    if status == "not checked":
        return "not run"
    return CAUGHT if status in _CAUGHT_STATUSES else status


def main(root: Path) -> None:
    total: Counter[str] = Counter()
    print(f"{'module':<52} {'caught':>7} {'ran':>5} {'score':>7} {'not run':>8}")
    for meta in sorted(root.glob("fxmobile/**/*.py.meta")):
        codes = json.loads(meta.read_text()).get("exit_code_by_key", {}).values()
        counts = Counter(verdict(code) for code in codes)
        ran = sum(counts.values()) - counts["not run"]
        total.update(counts)
        module = str(meta.relative_to(root)).removesuffix(".meta")
        score = f"{100 * counts[CAUGHT] / ran:.1f}%" if ran else "-"
        print(f"{module:<52} {counts[CAUGHT]:>7} {ran:>5} {score:>7} {counts['not run']:>8}")
    ran = sum(total.values()) - total["not run"]
    score = f"{100 * total[CAUGHT] / ran:.1f}%" if ran else "-"
    print(f"{'all':<52} {total[CAUGHT]:>7} {ran:>5} {score:>7} {total['not run']:>8}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "mutants"))
