"""What fxmobile does today with each model of a zoo kind, route by route (issue 12's inventory).

``python -m model_zoo_checks.inventory --kind timm ecosystem --out DIR`` takes every selected
catalogue model through three routes, each model in its own child process under the memory
guard and a timeout (``model_zoo_checks.guard``), and writes ``DIR/inventory.json`` and
``DIR/inventory.md``. The run is resumable: models already in the JSON are skipped (``--redo``
runs them again); ``--render`` only rewrites the Markdown (and the causes) from the JSON.

The routes, on the model as the catalogue builds it (random weights, statistics randomized):

- ``defaults``: ``fxmobile.optimize(model, example_inputs=x)``;
- ``auto_leaf``: the same with ``auto_leaf=True``. It acts only when tracing raises, so it is run
  only when ``defaults`` raised; otherwise the record says it is the same call;
- ``traced``: ``torch.jit.trace(model, x, strict=False)``, then ``fxmobile.optimize`` on the
  traced module (the TorchScript stage only, what ``optimize_for_mobile(traced)`` returns).

Each route records: ``ok`` (within 1e-4 of the output's scale), ``wrong`` (beyond it), ``nan``
(the optimized output has NaN or inf where eager has none), or the exception's class and first
line; the relative error against eager; what the frozen graph still runs unfolded
(``aten::batch_norm``) or unprepacked (convolutions by overload: ``aten::conv2d.padding`` is a
string padding); the auto leaves; and whether the model's state and training flags are exactly
what they were before. ``CAUSES`` maps what a failure says to the root cause it comes from.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from model_zoo_checks.guard import GuardError, run_json_guarded
from model_zoo_checks.zoo import Kind, ZooModel, all_models

TOLERANCE = 1e-4  # max abs error relative to max |eager output|
ROUTES = ("defaults", "auto_leaf", "traced")
# aten::_convolution_mode is what torch.jit.trace records for a string padding ('same').
CONV_KINDS = frozenset(
    {
        "aten::conv1d",
        "aten::conv2d",
        "aten::conv3d",
        "aten::_convolution",
        "aten::_convolution_mode",
        "aten::convolution",
    }
)
BATCH_NORM = "aten::batch_norm"

# (pattern, root cause), first match wins. The pattern is searched in "error || the exceptions
# it was raised from || where: the model's line that failed" (see ``_cause_text``).
CAUSES: tuple[tuple[str, str], ...] = (
    (r"GuardError.*timeout", "timeout"),
    (r"GuardError.*resident", "memory guard"),
    (r"GuardError", "child process died"),
    (
        r"cache.*changes the module's state|changes the module's state.*cache",
        "cache dict filled in forward",
    ),
    (r"changes the module's state", "state written in forward"),
    (r"writes to its input", "input written in forward"),
    (r"TrainingModeError|training mode", "training flag"),
    (r"Tracer cannot infer type", "jit.trace cannot type the output (a dict holding a list)"),
    (
        r"where: transformers/utils/generic\.py.*func\(self, \*args, \*\*kwargs\)",
        "*args/**kwargs forward: transformers' output decorator (Proxy cannot be iterated)",
    ),
    (r"cannot be iterated.*where: .*\*args", "*args/**kwargs forward (Proxy cannot be iterated)"),
    (r"cannot be iterated", "Proxy cannot be iterated"),
    (
        r"where: timm/layers/padding\.py",
        "shape arithmetic: Conv2dSame pads from the input's shape (math.ceil, max)",
    ),
    (r"int\(\) argument must be.*Proxy", "shape arithmetic: int() of a traced shape"),
    (r"'len' is not supported in symbolic tracing", "shape arithmetic: len() of a traced shape"),
    (
        r"ShapeProp error.*NoneType",
        "fxmobile's shape propagation: an optional input left None reaches an auto leaf",
    ),
    (
        r"where: .*\b(return_dict|output_hidden_states|output_attentions)\b",
        "optional argument defaulting to None tested in control flow",
    ),
    (r"where: .*\.device\.type", "device check in control flow (v.device.type)"),
    (r"control flow.*where: .*\bif\b", "shape check in control flow"),
    (r"control flow", "control flow on a traced value"),
)


def main(argv: Sequence[str] | None = None) -> int:
    """The inventory command line (see the module docstring); returns 0 (bad arguments exit 2).

    Rewrites ``DIR/inventory.json`` after every model, so a killed run keeps what it finished.
    With the hidden ``--child KEY`` it is the guarded child instead: one thread, one model
    probed here, its record printed as JSON.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.out is None and not args.child:
        parser.error("--out DIR is required: where the results go (not the repo)")
    if args.child:
        torch.set_num_threads(1)  # the parent set OMP_NUM_THREADS=1 before this process began
        print(json.dumps(probe(_by_key()[args.child], args.routes)))
        return 0
    path = args.out / "inventory.json"
    records: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.exists() else {}
    if not args.render:
        entries = [
            e
            for e in all_models()
            if e.kind in args.kind and (not args.models or e.key in args.models)
        ]
        todo = [e for e in entries if args.redo or e.key not in records]
        print(f"{len(entries)} selected, {len(entries) - len(todo)} already recorded", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        for i, entry in enumerate(todo, 1):
            start = time.monotonic()
            record = probe_guarded(entry, args.memory_limit, args.timeout, args.routes)
            if set(args.routes) != set(ROUTES) and "routes" in records.get(entry.key, {}):
                # some routes run again: keep the others' results
                record["routes"] = {**records[entry.key]["routes"], **record.get("routes", {})}
            records[entry.key] = record
            path.write_text(json.dumps(records, indent=1))
            print(
                f"[{i}/{len(todo)}] {entry.key:<45} {_summary(records[entry.key])} "
                f"{time.monotonic() - start:.0f}s",
                flush=True,
            )
    for record in records.values():
        for route in record.get("routes", {}).values():
            route["cause"] = cause_of(route)
    path.write_text(json.dumps(records, indent=1))
    (args.out / "inventory.md").write_text(render(records))
    print(f"wrote {path} and {args.out / 'inventory.md'}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m model_zoo_checks.inventory", description=__doc__)
    p.add_argument("--kind", nargs="+", type=Kind, default=[Kind.TIMM, Kind.ECOSYSTEM])
    p.add_argument("--models", nargs="+", metavar="KEY")
    p.add_argument("--out", type=Path, metavar="DIR", help="results (not the repo); required")
    p.add_argument("--redo", action="store_true", help="run models already recorded again")
    p.add_argument("--render", action="store_true", help="only rewrite the Markdown")
    p.add_argument("--timeout", type=float, default=1200.0, metavar="SECONDS")
    p.add_argument("--memory-limit", type=float, default=12.0, metavar="GIB")
    p.add_argument("--child", metavar="KEY", help=argparse.SUPPRESS)
    p.add_argument(
        "--routes", nargs="+", choices=ROUTES, default=list(ROUTES), help="with --redo: only these"
    )
    return p


def _by_key() -> dict[str, ZooModel]:
    return {e.key: e for e in all_models()}


def probe_guarded(
    entry: ZooModel,
    limit_gib: float = 12.0,
    timeout: float = 1200.0,
    routes: Sequence[str] = ROUTES,
) -> dict[str, Any]:
    """``probe`` in a child process; a guard stop or a crash becomes the record's error."""
    cmd = [sys.executable, "-m", "model_zoo_checks.inventory", "--child", entry.key]
    cmd += ["--routes", *routes]
    env_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        return dict(run_json_guarded(cmd, limit_gib, timeout, entry.key))
    except GuardError as exc:
        return {**_head(entry), "error": f"GuardError: {exc}"}
    finally:
        if env_threads is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = env_threads


def _head(entry: ZooModel) -> dict[str, Any]:
    return {
        "key": entry.key,
        "kind": entry.kind.value,
        "family": entry.family,
        "input_shape": list(entry.input_shape),
    }


def probe(entry: ZooModel, routes: Sequence[str] = ROUTES) -> dict[str, Any]:
    """Build ``entry`` and take it through ``routes`` (see the module docstring)."""
    import fxmobile

    warnings.simplefilter("ignore")
    record = _head(entry)
    start = time.perf_counter()
    try:
        model = entry.build_randomized()
        inputs = entry.example_inputs()
        with torch.no_grad():
            expected = model(*inputs)
    except Exception as exc:
        record["error"] = f"building: {_first_line(exc)}"
        return record
    record["params"] = sum(p.numel() for p in model.parameters())
    record["eager_finite"] = all(torch.isfinite(t).all().item() for t in _tensors(expected))
    record["outputs"] = _describe(expected)
    before = _state(model)
    results: dict[str, dict[str, Any]] = {}

    def run(route: str, call: Callable[[], tuple[nn.Module, Any]]) -> None:
        t0 = time.perf_counter()
        results[route] = _run_route(call, model, expected, inputs)
        results[route]["untouched"] = _same_state(before, _state(model))
        results[route]["seconds"] = round(time.perf_counter() - t0, 1)

    if "defaults" in routes:
        run("defaults", lambda: _optimized(fxmobile.optimize(model, example_inputs=inputs)))
    if "auto_leaf" in routes:
        if "error" in results.get("defaults", {"error": True}):
            run(
                "auto_leaf",
                lambda: _optimized(fxmobile.optimize(model, example_inputs=inputs, auto_leaf=True)),
            )
        else:
            results["auto_leaf"] = {"same_as": "defaults"}
    if "traced" in routes:
        run("traced", lambda: _traced(model, inputs))
    record["routes"] = results
    record["untouched"] = _same_state(before, _state(model))
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def _optimized(result: Any) -> tuple[nn.Module, Any]:
    return result.module, result.report


def _traced(model: nn.Module, inputs: tuple[Any, ...]) -> tuple[nn.Module, Any]:
    import fxmobile

    with torch.no_grad():
        traced = torch.jit.trace(model, inputs, strict=False, check_trace=False)
    _BN_SOURCES.clear()
    _BN_SOURCES.update(_bn_sources(traced))
    return _optimized(fxmobile.optimize(traced))


# The traced route's batch_norm scope -> its input's scope, read before optimizing: the
# prepacked convs a pass creates have no scope of their own.
_BN_SOURCES: dict[str, str] = {}


def _bn_sources(traced: torch.jit.ScriptModule) -> dict[str, str]:
    from fxmobile.script.graph_utils import iter_nodes

    sources = {}
    for node in iter_nodes(traced.inlined_graph):
        if node.kind() == BATCH_NORM:
            sources[node.scopeName()] = node.inputsAt(0).node().scopeName()
    return sources


def _run_route(
    call: Callable[[], tuple[nn.Module, Any]],
    model: nn.Module,
    expected: Any,
    inputs: tuple[Any, ...],
) -> dict[str, Any]:
    from fxmobile import FxMobileError

    try:
        module, report = call()
    except Exception as exc:
        return {
            "error": _first_line(exc),
            "fxmobile_error": isinstance(exc, FxMobileError),
            "where": _where(exc),
            "chain": [_first_line(e) for e in _chain(exc)[1:]],
        }
    out: dict[str, Any] = {"ops_left": graph_ops_left(module)}
    out["batch_norm_sites"] = batch_norm_sites(module, model)
    out["skips"] = {f"{r.stage.value}.{r.name}": r.skips for r in report.passes if r.skips}
    out["leaves"] = [n for n in report.notes if "opaque leaves" in n]
    out["notes"] = [n for n in report.notes if "opaque leaves" not in n]
    try:
        with torch.no_grad():
            actual = module(*inputs)
        out["relative_error"] = relative_error(expected, actual)
    except Exception as exc:
        out["error"] = f"running the optimized module: {_first_line(exc)}"
        return out
    error = out["relative_error"]
    out["outcome"] = "nan" if not math.isfinite(error) else "ok" if error <= TOLERANCE else "wrong"
    return out


def relative_error(expected: Any, actual: Any) -> float:
    """Max over tensor outputs, paired in flattening order (a traced module returns plain dicts
    and tuples where eager returned a ``ModelOutput``), of max |actual - expected| / max
    |expected|; inf when the outputs do not pair up, NaN when the optimized output has a
    non-finite value eager does not."""
    ref, act = _tensors(expected), _tensors(actual)
    if len(ref) != len(act) or any(r.shape != a.shape for r, a in zip(ref, act, strict=True)):
        return math.inf
    worst = 0.0
    for r, a in zip(ref, act, strict=True):
        r64, a64 = r.detach().double(), a.detach().double()
        if bool((torch.isfinite(r64) & ~torch.isfinite(a64)).any()):
            return math.nan
        finite = torch.isfinite(r64)
        scale = float(r64[finite].abs().max()) if finite.any() else 0.0
        diff = float((a64 - r64)[finite].abs().max()) if finite.any() else 0.0
        worst = max(worst, diff / scale if scale else diff)
    return worst


def graph_ops_left(module: nn.Module) -> dict[str, int]:
    """``aten::batch_norm`` and unprepacked convolutions in the frozen forward, by overload."""
    from fxmobile.script.graph_utils import iter_nodes

    counts: Counter[str] = Counter()
    graph = module._c._get_method("forward").inlined_graph  # type: ignore[union-attr,operator]
    for node in iter_nodes(graph):
        kind = node.kind()
        if kind == BATCH_NORM:
            counts[kind] += 1
        elif kind in CONV_KINDS:
            inputs = list(node.inputs())
            string_padding = len(inputs) > 4 and isinstance(inputs[4].type(), torch._C.StringType)
            counts[kind + (".padding" if string_padding else "")] += 1
    return dict(sorted(counts.items()))


def batch_norm_sites(module: nn.Module, model: nn.Module) -> dict[str, int]:
    """Each ``aten::batch_norm`` left, as "<its module's class> after <its input's op>", and for
    an input from a module, " (<that module's class>, same parent|other parent)": modules from
    the nodes' scopes (traced graphs keep them; "?" where the graph has none). So a BN a pass
    should fold (after a conv) is told from one it must decompose (after an add), and a BN whose
    conv sits in another submodule from one whose conv is a subclass with its own forward."""
    from fxmobile.script.graph_utils import iter_nodes

    counts: Counter[str] = Counter()
    graph = module._c._get_method("forward").inlined_graph  # type: ignore[union-attr,operator]
    for node in iter_nodes(graph):
        if node.kind() != BATCH_NORM:
            continue
        producer = node.inputsAt(0).node()
        bn_path, bn_owner = _scope_owner(node, model)
        site = f"{bn_owner} after {producer.kind()}"
        src_path, src_owner = _scope_owner(producer, model, _BN_SOURCES.get(node.scopeName()))
        if src_path and bn_path and src_path != bn_path:
            same = src_path.rpartition(".")[0] == bn_path.rpartition(".")[0]
            site += f" ({src_owner}, {'same' if same else 'other'} parent)"
        counts[site] += 1
    return dict(sorted(counts.items()))


def _scope_owner(
    node: torch._C.Node, model: nn.Module, scope: str | None = None
) -> tuple[str, str]:
    path = (scope or node.scopeName()).split("/")[-1].removeprefix("__module.")
    try:
        return path, type(model.get_submodule(path)).__name__ if path else "?"
    except AttributeError:
        return path, "?"


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _describe(value: Any) -> str:
    shapes = ", ".join("x".join(map(str, t.shape)) for t in _tensors(value))
    return f"{type(value).__name__} of {len(_tensors(value))} tensor(s): {shapes}"[:300]


def _state(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[bool]]:
    tensors = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    return tensors, [m.training for m in model.modules()]


def _same_state(
    a: tuple[dict[str, torch.Tensor], list[bool]], b: tuple[dict[str, torch.Tensor], list[bool]]
) -> bool:
    (ta, fa), (tb, fb) = a, b
    return (
        fa == fb
        and ta.keys() == tb.keys()
        and all(ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]) for k in ta)
    )


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:600]


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first."""
    chain = [exc]
    while (nxt := chain[-1].__cause__ or chain[-1].__context__) and nxt not in chain:
        chain.append(nxt)
    return chain


def _where(exc: BaseException) -> str:
    """The innermost frame of the innermost exception outside torch, fxmobile and this tool:
    the model's (or its library's) line that failed."""
    for inner in reversed(_chain(exc)):
        frames = [
            f
            for f in traceback.extract_tb(inner.__traceback__)
            if not any(part in f.filename for part in _OURS)
        ]
        if frames:
            frame = frames[-1]
            return f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno} {frame.line}"
    return ""


_OURS = ("/torch/", "/fxmobile/", "/model_zoo_checks/")


def cause_of(route: dict[str, Any]) -> str | None:
    """The root cause of a failed route (``CAUSES``), or what an ``ok`` route left behind."""
    if "same_as" in route:
        return None
    if "error" in route:
        text = _cause_text(route)
        for pattern, cause in CAUSES:
            if re.search(pattern, text):
                return cause
        return "unclassified"
    if route.get("outcome") in ("nan", "wrong"):
        return "NaN output" if route["outcome"] == "nan" else "numerics beyond tolerance"
    left = route.get("ops_left", {})
    parts = sorted({_bn_cause(site, route) for site in route.get("batch_norm_sites", {})})
    if left.get(BATCH_NORM) and not parts:
        parts.append("batch_norm left (sites not recorded)")
    for conv in sorted(k for k in left if k != BATCH_NORM):
        why = [
            f"{name.split('.')[-1]}: {', '.join(skips)}"
            for name, skips in route.get("skips", {}).items()
            if "conv" in name and "1d" in name and conv.endswith("conv1d")
        ]
        parts.append(
            f"{conv.removeprefix('aten::')} not prepacked" + (f" ({'; '.join(why)})" if why else "")
        )
    return "; ".join(parts) or None


def _bn_cause(site: str, route: dict[str, Any]) -> str:
    """The root cause of one batch_norm left, from its site (see ``batch_norm_sites``)."""
    owner, _, rest = site.partition(" after ")
    producer, _, source = rest.partition(" (")
    if not ("conv" in producer or producer == "aten::_convolution"):
        return f"BN after a non-conv op not decomposed ({producer.removeprefix('aten::')})"
    if owner == "?":
        inside = "inside an auto leaf" if route.get("leaves") else "module unknown"
        return f"BN after a conv not folded ({inside})"
    if owner != "BatchNorm2d":
        return f"{owner} (BN subclass with its own forward) after a conv not folded"
    conv = source.split(",")[0]
    if "other parent" in source:
        return f"BatchNorm2d after a {conv} in another submodule not folded"
    return f"BatchNorm2d after a {conv or 'conv'} not folded"


def _cause_text(route: dict[str, Any]) -> str:
    return " || ".join(
        [route["error"], *route.get("chain", []), f"where: {route.get('where', '')}"]
    )


def _cell(route: dict[str, Any] | None) -> str:
    if route is None:
        return ""
    if "same_as" in route:
        return f"= {route['same_as']}"
    if "error" in route:
        return route["error"].replace("|", "\\|")[:160]
    left = ", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in route["ops_left"].items())
    return f"{route['outcome']} {route['relative_error']:.1e}" + (f"; left: {left}" if left else "")


def _summary(record: dict[str, Any]) -> str:
    if "error" in record:
        return record["error"][:80]
    return " | ".join(
        f"{name}: {_outcome(route)}" for name, route in record.get("routes", {}).items()
    )


def _outcome(route: dict[str, Any]) -> str:
    if "same_as" in route:
        return f"= {route['same_as']}"
    if "error" in route:
        return route["error"].split(":")[0]
    return str(route.get("outcome"))


def render(records: dict[str, dict[str, Any]]) -> str:
    """The Markdown inventory: counts per route and outcome, per cause, then every model."""
    lines = ["# fxmobile inventory: timm and ecosystem models", ""]
    for kind in (Kind.TIMM.value, Kind.ECOSYSTEM.value):
        group = [r for r in records.values() if r.get("kind") == kind]
        if not group:
            continue
        lines += [f"## {kind}: {len(group)} models", ""]
        lines += ["| route | " + " | ".join(_OUTCOMES) + " |", "|---" * (len(_OUTCOMES) + 1) + "|"]
        for route in ROUTES:
            counts = Counter(_bucket(r, route) for r in group)
            lines.append(f"| {route} | " + " | ".join(str(counts[o]) for o in _OUTCOMES) + " |")
        lines += ["", "| route | cause | models |", "|---|---|---|"]
        for route in ROUTES:
            by_cause: dict[str, list[str]] = {}
            for r in group:
                cause = r.get("routes", {}).get(route, {}).get("cause")
                if "error" in r:
                    cause = r["error"][:60]
                if cause:
                    by_cause.setdefault(cause, []).append(r["key"])
            for cause, keys in sorted(by_cause.items(), key=lambda kv: -len(kv[1])):
                lines.append(f"| {route} | {cause} ({len(keys)}) | {', '.join(keys)} |")
        lines += ["", "| model | family | params (M) | " + " | ".join(ROUTES) + " |"]
        lines.append("|---" * (3 + len(ROUTES)) + "|")
        for r in group:
            params = f"{r['params'] / 1e6:.1f}" if "params" in r else ""
            if "error" in r:
                cells = [r["error"].replace("|", "\\|")[:160], "", ""]
            else:
                cells = [_cell(r["routes"].get(route)) for route in ROUTES]
            lines.append(f"| {r['key']} | {r['family']} | {params} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


_OUTCOMES = ("ok", "ok, left unfused", "wrong", "nan", "refused", "crashed", "not run")


def _bucket(record: dict[str, Any], route: str) -> str:
    if "error" in record:  # the build failed, or the child was stopped or died
        return "crashed"
    result = record.get("routes", {}).get(route)
    if result is None:
        return "not run"
    if "same_as" in result:
        result = record["routes"][result["same_as"]]
    if "error" in result:
        return "refused" if result.get("fxmobile_error") else "crashed"
    if result["outcome"] == "ok":
        return "ok, left unfused" if result["ops_left"] else "ok"
    return str(result["outcome"])


if __name__ == "__main__":
    sys.exit(main())
