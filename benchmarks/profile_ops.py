"""Per-op profile of fxmobile's files against upstream's, in a real runtime's lite interpreter.

Why: a file that is slower than ExecuTorch's program on the same XNNPACK kernels loses either
in the kernels or in the graph around them (copies, layout changes, shape arithmetic,
out-of-place elementwise ops, interpreter instructions). This script says which, per op.

For each model (torchvision, random weights, BatchNorm statistics randomized, eval, batch 1,
1x3x224x224) it writes, in this process (fxmobile's torch):

- ``fxm``: ``fxmobile.optimize(model, example_inputs=x)``, the eager route;
- ``fxm_script``: ``fxmobile.optimize_for_mobile(torch.jit.script(model), example_inputs=x)``,
  the ScriptModule route (``--no-script`` leaves it out);
- ``upstream``: ``torch.jit.script(model)`` saved, then put through the runtime's own
  ``optimize_for_mobile`` there.

Then one child process of the reference runtime (``profile_ops_child.py``, run by path with
that venv's python) loads the three in its lite interpreter, times them interleaved (each
round runs each once, in a fresh random order), and profiles each alone with
``torch.profiler``: self CPU time per op and calls per run. Printed per model: the latency
table (median, 10th and 90th percentile of wall time, and the median and 10th percentile of
the calling thread's CPU time: with ``--threads 1`` that is all of the work, and it holds up on
a loaded machine where wall time does not), each file's interpreter instructions and operator
calls (from its bytecode), and the per-op table, slowest first. ``--against DIR`` adds the
files an earlier run kept (``--keep DIR``) to the same interleaved run, for before/after.
Every candidate's output is checked against eager (max abs error relative to eager's largest
magnitude).

Run from the repository root with the runtimes installed (``make runtimes``):
``python benchmarks/profile_ops.py [--models ...] [--rounds N] [--runtime 2.12.1]``.
Compare ratios within one run; the machine is shared and absolute figures move with load.
``--write-docs`` also writes every model's latency table into the performance page
(``benchmarks/figures.py``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torchvision
from tabulate import tabulate

# run by path (python benchmarks/...), the repository root is not on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fxmobile
from benchmarks import figures
from fxmobile.runtime import require_installed
from fxmobile.verify import randomize_batchnorm_statistics

MODELS = (
    "mobilenet_v3_small",
    "efficientnet_b0",
    "shufflenet_v2_x1_0",
    "resnet18",
    "resnet50",
)
INPUT_SHAPE = (1, 3, 224, 224)
# The block of docs/pages/performance.md that --write-docs fills.
FIGURES = "real-runtime-ops"
LATENCY_HEADERS = ["file", "median ms", "p10 ms", "p90 ms", "x upstream", "cpu median",
                   "cpu p10", "cpu x upstream", "instructions", "op calls", "profiled ms",
                   "rel err"]  # fmt: skip
CHILD = Path(__file__).resolve().with_name("profile_ops_child.py")


class _Opaque:
    """Stands for any object ``bytecode.pkl`` builds (``build_intlist``, schema types): none
    carries anything counted here."""

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _Bytecode(pickle.Unpickler):
    """Reads a lite-interpreter file's ``bytecode.pkl``: tuples of strings and ints."""

    def find_class(self, module: str, name: str) -> Any:
        return _Opaque

    def persistent_load(self, pid: Any) -> Any:
        return None  # tensors stored beside the bytecode


def bytecode_counts(path: Path) -> dict[str, int]:
    """Interpreter instructions and operator calls of every method in a lite file."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("bytecode.pkl"))
        data = _Bytecode(io.BytesIO(archive.read(name))).load()
    instructions = Counter[str]()
    for method in data[1:]:
        table = dict(method[1])
        instructions.update(op for op, _, _ in table["instructions"])
    return {"instructions": sum(instructions.values()), "OP": instructions["OP"]}


def make_model(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """torchvision's ``name`` in eval mode, random weights and randomized BatchNorm statistics
    under seed 0, and its input: the model every profile here measures."""
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    randomize_batchnorm_statistics(model, INPUT_SHAPE)
    return model, torch.randn(INPUT_SHAPE)


def build(name: str, workdir: Path, script_route: bool) -> tuple[list[dict[str, Any]], Any]:
    """The candidates' files and eager's output on the input saved in ``workdir``."""
    model, x = make_model(name)
    torch.save(x, workdir / "input.pt")
    with torch.no_grad():
        expected = model(x)
    candidates = []
    path = workdir / f"{name}_fxm.ptl"
    fxmobile.optimize(model, example_inputs=x).save(path)
    candidates.append({"name": "fxm", "kind": "lite", "path": str(path)})
    if script_route:
        path = workdir / f"{name}_fxm_script.ptl"
        scripted = fxmobile.optimize_for_mobile(torch.jit.script(model), example_inputs=x)
        scripted._save_for_lite_interpreter(str(path))
        candidates.append({"name": "fxm_script", "kind": "lite", "path": str(path)})
    path = workdir / f"{name}_scripted.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    candidates.append(
        {
            "name": "upstream",
            "kind": "upstream",
            "path": str(path),
            "save_to": str(workdir / f"{name}_upstream.ptl"),
        }
    )
    return candidates, expected


def run_child(
    python: Path, request: dict[str, Any], threads: int, argv: Sequence[str] = (str(CHILD),)
) -> dict[str, Any]:
    """Run ``argv`` (``profile_ops_child.py``) with another venv's ``python`` (isolated: ``-I``,
    without ``PYTHONPATH``/``VIRTUAL_ENV``, OpenMP and MKL at ``threads``), ``request`` on its
    stdin; its JSON reply. ``RuntimeError`` with the end of its stderr when it fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    done = subprocess.run(
        [str(python), "-I", *argv],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed:\n{done.stderr[-3000:]}")
    reply: dict[str, Any] = json.loads(done.stdout)
    return reply


def relative_error(expected: torch.Tensor, actual: torch.Tensor) -> float:
    """Max abs difference over eager's largest magnitude (over 1 when eager is all zeros)."""
    scale = expected.abs().max().item() or 1.0
    return float((expected - actual).abs().max().item() / scale)


def latency_rows(
    reply: dict[str, Any], files: dict[str, Path], errors: dict[str, float]
) -> list[list[Any]]:
    """One row per file, ``LATENCY_HEADERS``' columns: the latency in the reference runtime's
    lite interpreter (wall ms, and the calling thread's CPU ms), each as a ratio to upstream's
    file too, the file's instruction and operator-call counts, the profiled self time and the
    error against eager."""
    upstream = reply["latency"]["upstream"]["median"]
    upstream_cpu = reply["cpu"]["upstream"]["median"]
    rows = []
    for cand in reply["latency"]:
        lat, cpu = reply["latency"][cand], reply["cpu"][cand]
        counts = bytecode_counts(files[cand])
        profiled = sum(us for _, us in reply["profiles"][cand].values()) / 1e3
        rows.append([cand, lat["median"], lat["p10"], lat["p90"], lat["median"] / upstream,
                     cpu["median"], cpu["p10"], cpu["median"] / upstream_cpu,
                     counts["instructions"], counts["OP"], profiled, errors[cand]])  # fmt: skip
    return rows


def report(name: str, reply: dict[str, Any], files: dict[str, Path], errors: dict[str, float],
           top: int) -> None:  # fmt: skip
    """Print one model's tables: per file the wall-clock latency (ms, median and percentiles)
    and the calling thread's CPU time, both as measured in the reference runtime's lite
    interpreter and as ratios to upstream's file (above 1: slower), its instruction and
    operator-call counts, the profiled self time and the error against eager; then the ``top``
    ops by the first file's self CPU time, calls and microseconds per run for each file."""
    names = list(reply["latency"])
    rows = latency_rows(reply, files, errors)
    print(f"\n## {name} (torch {reply['torch']}, XNNPACK {reply['xnnpack']}, "
          f"{reply['threads']} threads)")  # fmt: skip
    print(tabulate(rows, headers=LATENCY_HEADERS, floatfmt=".3g"))
    ops = sorted(
        {op for cand in names for op in reply["profiles"][cand]},
        key=lambda op: -reply["profiles"][names[0]].get(op, [0, 0])[1],
    )
    table = []
    for op in ops[:top]:
        row: list[Any] = [op]
        for cand in names:
            calls, us = reply["profiles"][cand].get(op, [0, 0])
            row += [calls, us]
        table.append(row)
    headers = ["op"] + [f"{c} {h}" for c in names for h in ("calls", "us")]
    print(tabulate(table, headers=headers, floatfmt=".0f"))


def main() -> None:
    """Build each model's files here, hand them to one reference-runtime child per model
    (``--runtime``, default 2.12.1, with its XNNPACK kernels), and print the report; the load
    average is printed before and after. ``--keep DIR`` keeps the files (and the input and
    outputs) there instead of a temporary folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--runtime", default="2.12.1")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile-iterations", type=int, default=10)
    parser.add_argument("--top", type=int, default=15, help="ops shown per model")
    parser.add_argument("--no-script", action="store_true", help="leave out the script route")
    parser.add_argument("--keep", type=Path, help="folder to keep the files in")
    parser.add_argument(
        "--against",
        type=Path,
        help="a --keep folder of an earlier run: its fxm and fxm_script files run too "
        "(as before and before_script), interleaved with this run's",
    )
    figures.add_argument(parser)
    args = parser.parse_args()
    python = require_installed(args.runtime)
    docs_rows: list[list[Any]] = []
    conditions: dict[str, Any] = {}  # what the reference runtime ran them on, for the docs
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"({os.cpu_count()} cores)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            candidates, expected = build(name, workdir, not args.no_script)
            for old, label in (("fxm", "before"), ("fxm_script", "before_script")):
                path = args.against / f"{name}_{old}.ptl" if args.against else None
                if path is not None and path.exists():
                    candidates.insert(-1, {"name": label, "kind": "lite", "path": str(path)})
            request = {
                "candidates": candidates,
                "input": str(workdir / "input.pt"),
                "outputs": str(workdir / "outputs.pt"),
                "threads": args.threads,
                "rounds": args.rounds,
                "warmup": args.warmup,
                "profile_iterations": args.profile_iterations,
            }
            reply = run_child(python, request, args.threads)
            outputs = torch.load(workdir / "outputs.pt")
            errors = {c: relative_error(expected, outputs[c]) for c in outputs}
            files = {c["name"]: Path(c.get("save_to") or c["path"]) for c in candidates}
            report(name, reply, files, errors, args.top)
            docs_rows += [[name, *row] for row in latency_rows(reply, files, errors)]
            conditions = {
                "runtime": f"torch {reply['torch']} lite interpreter (reference runtime)",
                "kernels": f"its own prepacked:: ops (XNNPACK enabled: {reply['xnnpack']})",
                "threads": reply["threads"],
            }
    if args.write_docs and docs_rows:
        run = figures.finish(load_before=load[0], **conditions)
        table = figures.markdown_table(["model", *LATENCY_HEADERS], docs_rows, ".3g")
        figures.write(FIGURES, table, run)
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
