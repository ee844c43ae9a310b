"""The run's journal: each model's results appended to ``DIR/journal.jsonl`` as soon as they are
in, so a run that is killed (the OOM killer took three zoo shards at once on this shared
machine, and with them an hour of results) goes on where it stopped with ``--resume``.

One line per model: the JSON list of its results, one per backend. On resume the lines that
parse are kept (a line cut short by the kill, written by a runner whose results had other
fields, or by the other kind of run, lite-interpreter file or ExecuTorch programs, is dropped,
and its model runs again) and the file is rewritten with them before anything is appended.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from model_zoo_checks.output_executorch import on_executorch
from model_zoo_checks.results import ModelResult
from model_zoo_checks.zoo import ZooModel

JOURNAL = "journal.jsonl"


class Journal:
    """The run's journal file (see the module docstring); ``path`` None keeps no journal.

    Opening it truncates the file, unless ``resume`` is set, in which case the complete lines
    of this kind of run (``executorch``: results made for ExecuTorch) are kept and
    their results are in ``previous``, keyed by model key.
    """

    def __init__(self, path: Path | None, resume: bool = False, executorch: bool = False) -> None:
        self.path = path
        self.previous: dict[str, list[ModelResult]] = {}
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = path.read_text().splitlines() if resume and path.exists() else []
        kept = []
        for line in lines:
            try:
                results = [ModelResult.from_dict(d) for d in json.loads(line)]
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # cut short by a kill, or written by another version: run it again
            if on_executorch(results) != executorch:
                continue  # the other kind of run's
            if results:
                self.previous[results[0].key] = results
                kept.append(line)
        path.write_text("".join(f"{line}\n" for line in kept))

    @property
    def keys(self) -> set[str]:
        """The models the journal already holds."""
        return set(self.previous)

    def results_for(self, entries: Sequence[ZooModel]) -> list[ModelResult]:
        return [r for e in entries for r in self.previous.get(e.key, [])]

    def append(self, results: Sequence[ModelResult]) -> None:
        if self.path is None or not results:
            return
        with self.path.open("a") as journal:
            journal.write(json.dumps([r.to_dict() for r in results]) + "\n")
