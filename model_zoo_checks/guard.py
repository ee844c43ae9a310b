"""Run a command in a child process under a resident-memory guard; its last stdout line is JSON.

The giants (vit_h_14, regnet_y_128gf) need most of the machine's memory to optimize: in their
own process, a runaway is killed at the guard and reported instead of taking the run (or the
machine) down, and the parent's memory stays flat. Output goes to temporary files, not pipes,
so a chatty child cannot fill a pipe and stall.
"""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any


class GuardError(RuntimeError):
    """The child passed the memory guard or the timeout, or died without a result."""


def run_json_guarded(
    cmd: Sequence[str], limit_gib: float, timeout: float, label: str, poll: float = 0.5
) -> Any:
    """The JSON value the child prints last; ``GuardError`` naming ``label`` otherwise."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, text=True)
        start = time.monotonic()
        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, rss_gib(proc.pid))
            over_memory = peak > limit_gib
            if over_memory or time.monotonic() - start > timeout:
                proc.kill()
                proc.wait()
                what = (
                    f"stopped at {peak:.1f} GiB resident (guard {limit_gib:g} GiB)"
                    if over_memory
                    else f"stopped after {timeout:.0f} s (timeout)"
                )
                raise GuardError(f"{label}: {what}")
            time.sleep(poll)
        out.seek(0)
        err.seek(0)
        lines = out.read().strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = [line for line in err.read().strip().splitlines() if line.strip()][-1:]
            raise GuardError(f"{label}: child {_exit(proc.returncode)}; {' '.join(tail)}")
        return json.loads(lines[-1])


def rss_gib(pid: int) -> float:
    """Resident memory of process ``pid`` in GiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def _exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}" if code else "printed no result"
