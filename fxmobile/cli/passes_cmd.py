"""``fxmobile passes``: what ``optimize`` runs for a backend, in order, and what switches it off.

One row per pass: its stage, its name (the file it lives in, the name the report shows), the
blocklist member that switches it off (``—`` when none can: Vulkan reads one member, Metal
none) and the rewrite it makes, as the
pass itself states it (``Pass.summary``). The FX stage is the one ``optimize`` runs for that
backend: channels-last on the CPU unless asked otherwise, leaf inlining last.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fxmobile.backends.registry import backend_spec
from fxmobile.cli.common import add_format, table
from fxmobile.infra import Pass
from fxmobile.options import Backend, MobileOptimizerType
from fxmobile.passes.pipeline import fx_pipeline

HEADERS = ["stage", "pass", "blocklist member", "rewrite"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``passes``' arguments: the backend and the table format."""
    parser.add_argument(
        "--backend",
        type=str.lower,
        choices=[b.value for b in Backend],
        default=Backend.CPU.value,
        help="whose TorchScript stage to list (default cpu)",
    )
    add_format(parser)


def rows(backend: Backend) -> list[list[object]]:
    """[stage, pass, member, rewrite] for every pass ``optimize`` runs for ``backend``."""
    spec = backend_spec(backend)
    fx = fx_pipeline(channels_last=backend is Backend.CPU, for_script=True)
    return [_row("fx", p, None) for p in fx] + [
        _row("script", p, spec.honours) for p in spec.passes()
    ]


def _row(
    stage: str,
    p: Pass[Any, Any],
    honours: frozenset[MobileOptimizerType] | None,
) -> list[object]:
    """One row; a member the backend does not read (Vulkan, Metal) switches nothing off."""
    member = p.optimization
    read = member is not None and (honours is None or member in honours)
    return [stage, p.name, member.name if read and member else "—", p.summary]


def run(args: argparse.Namespace) -> int:
    """Print the pass table for ``args.backend``; always 0."""
    found = rows(Backend(args.backend))
    if args.format == "json":
        passes = [
            # no member is null in JSON, not the table's dash
            {
                "stage": stage,
                "pass": name,
                "blocklist_member": None if member == "—" else member,
                "rewrite": rewrite,
            }
            for stage, name, member, rewrite in found
        ]
        document = {"backend": Backend(args.backend).name, "passes": passes}
        args.console.result(json.dumps(document, indent=2))
    else:
        args.console.result(table(found, HEADERS, args.format, numbers=False))
    return 0
