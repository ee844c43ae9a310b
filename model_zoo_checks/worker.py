"""The child process of a guarded check: ``python -m model_zoo_checks.worker KEY OPTIONS_JSON``.

Checks the one model in this process and prints its results (one per backend) as one JSON line.
"""

from __future__ import annotations

import json
import sys

from model_zoo_checks.runner import RunOptions, check_here
from model_zoo_checks.zoo import all_models, quick_models


def main(argv: list[str]) -> None:
    """Check the model keyed ``argv[0]`` (any kind, quick subset included) with the
    ``RunOptions`` JSON ``argv[1]`` and print its results; an unknown key exits with a message."""
    key, options = argv[0], RunOptions.from_json(argv[1])
    by_key = {m.key: m for m in (*all_models(), *quick_models())}
    if key not in by_key:
        raise SystemExit(f"no zoo model {key!r}; see python -m model_zoo_checks --list")
    results = check_here(by_key[key], options)
    print(json.dumps([r.to_dict() for r in results]))


if __name__ == "__main__":
    main(sys.argv[1:])
