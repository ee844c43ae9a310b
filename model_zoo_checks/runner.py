"""Check zoo models through ``fxmobile.optimize``, one model at a time, and measure them.

Per model: build it (random weights, randomized statistics), then per backend optimize it,
compare with eager (relative error; top-5 indices for classifiers), read the report (ops left
unfused, lite-interpreter size) and, on the CPU, time eager against optimized with interleaved
medians. Vulkan runs with ``VULKAN_AUTOMATIC_GPU_TRANSFER`` blocklisted: the transfer to a
Vulkan device cannot run on this machine, and without it the numerics can be checked.

A model that raises is recorded with its error and the run goes on. Giants (and every model with
``isolate``) run in a child process under a memory guard (``python -m model_zoo_checks.worker``).

With ``RunOptions.executorch`` (``--runtime executorch``) no lite-interpreter file is made: the
eager model goes to ExecuTorch by fxmobile's flow and by ExecuTorch's own
(``model_zoo_checks.on_executorch``), one CPU result per model carrying both programs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

import fxmobile
from fxmobile import Backend, MobileOptimizerType
from fxmobile.api import EXECUTORCH
from fxmobile.script.quiet_script import quietly_script
from fxmobile.timing import interleaved_medians
from fxmobile.verify import run_model
from model_zoo_checks.guard import GuardError, run_json_guarded
from model_zoo_checks.results import ModelResult, RuntimeRecord, Status, first_line
from model_zoo_checks.zoo import Kind, Route, ZooModel

MAX_ROUNDS = 100


@dataclass(frozen=True)
class RunOptions:
    """How the zoo run checks each model, as the command line set it; ``to_json`` and
    ``from_json`` carry it to a guarded child (``model_zoo_checks.worker``)."""

    backends: tuple[Backend, ...] = (Backend.CPU,)
    rounds: int = 3  # timed rounds per model at least (0: no latency)
    min_time: float = 1.0  # seconds of timed rounds a fast model gets (see _rounds)
    warmup: int = 1
    threads: int = 2
    blocklist: frozenset[MobileOptimizerType] = frozenset()
    skip_giants: bool = False
    include_unsupported: bool = False
    isolate: bool = False  # every model in its own guarded process, not only the giants
    memory_limit_gib: float = 20.0
    timeout: float = 1800.0
    runtimes: tuple[str, ...] = ()  # reference runtimes the CPU file goes to (on_runtimes)
    # --runtime executorch: both flows' ExecuTorch programs instead of the file (on_executorch)
    executorch: bool = False

    def target_runtime(self, backend: Backend) -> str | None:
        """What a model is made for on ``backend``: ExecuTorch (``executorch``, its programs),
        the oldest reference runtime (one CPU file for every selected runtime, its operators
        written out for the oldest), or None (the lite-interpreter file for torch here)."""
        if self.executorch:
            return EXECUTORCH
        return self.runtimes[0] if backend is Backend.CPU and self.runtimes else None

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["backends"] = [b.value for b in self.backends]
        data["blocklist"] = sorted(m.name for m in self.blocklist)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> RunOptions:
        data = json.loads(text)
        data["backends"] = tuple(Backend(b) for b in data["backends"])
        data["blocklist"] = frozenset(MobileOptimizerType[m] for m in data["blocklist"])
        data["runtimes"] = tuple(data.get("runtimes", ()))
        return cls(**data)


def check_model(entry: ZooModel, options: RunOptions) -> list[ModelResult]:
    """One result per backend; never raises for a model's failure."""
    if entry.unsupported and not options.include_unsupported:
        return [
            _not_run(entry, b, Status.UNSUPPORTED, entry.unsupported, options)
            for b in options.backends
        ]
    if entry.giant and options.skip_giants:
        reason = "giant skipped (--skip-giants)"
        return [_not_run(entry, b, Status.SKIPPED, reason, options) for b in options.backends]
    if entry.giant or options.isolate:
        return check_in_child(entry, options)
    return check_here(entry, options)


def will_run(entry: ZooModel, options: RunOptions) -> bool:
    """Whether ``check_model`` would check ``entry`` rather than record it unsupported or
    skipped (the progress bar counts only these)."""
    if entry.unsupported and not options.include_unsupported:
        return False
    return not (entry.giant and options.skip_giants)


def check_in_child(entry: ZooModel, options: RunOptions) -> list[ModelResult]:
    """``check_here`` in a ``model_zoo_checks.worker`` child under the memory guard and
    timeout of ``options``; a child killed or dead without a result gives an error result per
    backend, with the seconds it ran."""
    cmd = [sys.executable, "-m", "model_zoo_checks.worker", entry.key, options.to_json()]
    start = time.perf_counter()
    try:
        data = run_json_guarded(cmd, options.memory_limit_gib, options.timeout, entry.key)
    except GuardError as exc:
        seconds = time.perf_counter() - start
        return [
            _not_run(entry, b, Status.ERROR, first_line(exc), options, seconds)
            for b in options.backends
        ]
    return [ModelResult.from_dict(d) for d in data]


def check_here(entry: ZooModel, options: RunOptions) -> list[ModelResult]:
    """Build ``entry`` in this process and check it on each backend of ``options``: one result
    per backend, in order; a model that fails to build gives an error result per backend.

    Sets torch's thread count to ``options.threads`` for the process (and leaves it so). Each
    result's ``seconds`` is that backend's wall time; the first backend's includes the build.
    With ``options.executorch``, one result: the model on ExecuTorch (``_check_on_executorch``).
    """
    torch.set_num_threads(options.threads)
    start = time.perf_counter()
    results = []
    with quiet_warnings(), _engine_for(entry):
        try:
            model = entry.build_randomized()
            inputs = entry.example_inputs()
            # ExecuTorch takes the eager model (torch.export), whatever the lite route
            scripted = entry.route is Route.SCRIPT and not options.executorch
            module = quietly_script(model) if scripted else model
        except Exception as exc:
            error = f"building: {first_line(exc)}"
            seconds = time.perf_counter() - start
            return [
                _not_run(entry, b, Status.ERROR, error, options, seconds) for b in options.backends
            ]
        if options.executorch:
            results.append(_check_on_executorch(entry, model, inputs, options))
            results[-1].seconds = time.perf_counter() - start
        else:
            for backend in options.backends:
                result = _check_backend(entry, model, module, inputs, backend, options)
                result.seconds = time.perf_counter() - start  # the first pays for the build
                results.append(result)
                start = time.perf_counter()
        del model, module, inputs
    gc.collect()
    return results


def _check_backend(
    entry: ZooModel,
    model: torch.nn.Module,
    module: torch.nn.Module,
    inputs: tuple[Any, ...],
    backend: Backend,
    options: RunOptions,
) -> ModelResult:
    result = _not_run(entry, backend, Status.ERROR, None, options)
    blocklist = set(options.blocklist)
    if backend is Backend.VULKAN:
        blocklist.add(MobileOptimizerType.VULKAN_AUTOMATIC_GPU_TRANSFER)
    try:
        start = time.perf_counter()
        target = options.target_runtime(backend)
        mobile = fxmobile.optimize(
            module,
            blocklist,
            backend=backend,
            example_inputs=inputs,
            tolerance=entry.tolerance,
            target_runtime=target,
        )
        result.optimize_seconds = time.perf_counter() - start
        report = mobile.report
        result.notes = list(report.notes)
        result.ops_after = dict(sorted((report.ops_after or {}).items()))
        result.unfused_by_op = dict(sorted((report.unfused_ops or {}).items()))
        result.unfused_ops = sum(result.unfused_by_op.values())
        result.file_bytes = report.file_bytes
        if report.numerics:
            result.relative_error = max(c.relative_error for c in report.numerics)
        if entry.kind in (Kind.CLASSIFICATION, Kind.QUANTIZED):
            eager, optimized = run_model(model, inputs), run_model(mobile.module, inputs)
            result.top5_match = same_top5(eager, optimized)
        if backend is Backend.CPU and options.rounds > 0:
            candidates = {
                "eager": lambda: model(*inputs),
                "optimized": lambda: mobile.module(*inputs),
            }
            timings = interleaved_medians(
                candidates, _rounds(candidates, options), warmup=options.warmup
            )
            result.eager_ms = timings["eager"].median_ms
            result.eager_p10_ms = timings["eager"].p10_ms
            result.optimized_ms = timings["optimized"].median_ms
    except Exception as exc:
        result.error = first_line(exc)
        return result
    result.status, result.error = _verdict(result)
    if backend is Backend.CPU and options.runtimes:
        _on_runtimes(result, module, mobile, inputs, options)
    return result


def _check_on_executorch(
    entry: ZooModel, model: torch.nn.Module, inputs: tuple[Any, ...], options: RunOptions
) -> ModelResult:
    """The eager model made into an ExecuTorch program by both flows
    (``model_zoo_checks.on_executorch``): one CPU result; a check that raises is an error."""
    from model_zoo_checks.on_executorch import check_on_executorch, fill_result

    result = _not_run(entry, Backend.CPU, Status.ERROR, None, options)
    rounds = None if options.rounds <= 0 else lambda candidates: _rounds(candidates, options)
    try:
        records, eager = check_on_executorch(
            model,
            inputs,
            entry.tolerance,
            options.threads,
            rounds,
            warmup=options.warmup,
            blocklist=options.blocklist,
        )
    except Exception as exc:  # eager itself, or the runtime's thread pool
        result.error = first_line(exc)
        return result
    fill_result(result, records, eager)
    return result


def _on_runtimes(
    result: ModelResult,
    module: torch.nn.Module,
    mobile: fxmobile.MobileResult,
    inputs: tuple[Any, ...],
    options: RunOptions,
) -> None:
    """The saved file on the reference runtimes (``model_zoo_checks.on_runtimes``); a check
    that raises is recorded against each runtime it did not reach."""
    from model_zoo_checks.on_runtimes import check_file_on_runtimes, saved_file

    try:
        check_file_on_runtimes(
            result,
            module,
            saved_file(mobile),
            inputs,
            options.runtimes,
            options.threads,
            options.min_time,
            options.rounds,
        )
    except Exception as exc:
        why = f"the runtime check raised {first_line(exc)}"
        for version in options.runtimes:
            if version not in result.runtimes:
                result.runtimes[version] = RuntimeRecord(version, "", loads=False, error=why)


def _rounds(candidates: dict[str, Callable[[], object]], options: RunOptions) -> int:
    """``options.rounds``, or more for a fast model: as many as fill ``options.min_time``
    seconds (at most ``MAX_ROUNDS``), so a median of a few milliseconds is not noise."""
    start = time.perf_counter()
    with torch.no_grad():
        for run in candidates.values():
            run()
    one_round = time.perf_counter() - start
    fill = int(options.min_time / one_round) if one_round > 0 else MAX_ROUNDS
    return max(options.rounds, min(fill, MAX_ROUNDS))


def _verdict(result: ModelResult) -> tuple[Status, str | None]:
    tolerance = result.tolerance or 0.0
    if result.relative_error is None:
        return Status.FAILED, "numerics not checked: " + "; ".join(result.notes)
    if not result.relative_error <= tolerance:  # NaN fails too
        return Status.FAILED, f"relative error {result.relative_error:.3g} > {tolerance:g}"
    if result.top5_match is False:
        return Status.FAILED, "top-5 indices differ from eager"
    return Status.PASSED, None


def same_top5(eager: torch.Tensor, optimized: torch.Tensor) -> bool:
    """Identical top-5 indices; an order that differs only among exactly tied eager scores
    (common in a quantized model's outputs) counts as identical."""
    ref = eager.detach().reshape(eager.shape[0], -1)
    act = optimized.detach().reshape(ref.shape)
    ref_idx, act_idx = ref.topk(5).indices, act.topk(5).indices
    return torch.equal(ref_idx, act_idx) or torch.equal(
        ref.gather(1, ref_idx), ref.gather(1, act_idx)
    )


def _not_run(
    entry: ZooModel,
    backend: Backend,
    status: Status,
    why: str | None,
    options: RunOptions,
    seconds: float = 0.0,
) -> ModelResult:
    return ModelResult(
        key=entry.key,
        name=entry.name,
        kind=str(entry.kind),
        family=entry.family,
        backend=backend.value,
        route=str(entry.route),
        input_shape=list(entry.input_shape),
        status=status,
        error=why,
        tolerance=entry.tolerance,
        seconds=seconds,
        target_runtime=options.target_runtime(backend),
    )


def _engine_for(entry: ZooModel) -> contextlib.AbstractContextManager[None]:
    from model_zoo_checks.builders import quantized_engine

    return quantized_engine() if entry.kind is Kind.QUANTIZED else contextlib.nullcontext()


@contextlib.contextmanager
def quiet_warnings() -> Iterator[None]:
    """torch 2.15 deprecates TorchScript and eager quantization, which the zoo exercises."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*Lite Interpreter is deprecated")
        warnings.filterwarnings("ignore", message="torch.quantize_per_tensor, torch.quantize_per")
        warnings.filterwarnings("ignore", message=".*RCNN always returns a")
        yield


class Progress:
    """A tqdm bar over the models that will run (ETA; it renders in a notebook too), with one
    line per model written above it and kept in the log: statuses, its time, elapsed time."""

    def __init__(self, runs: int, stream: Any = None) -> None:
        self.count = 0
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.monotonic()
        self.bar = tqdm(total=runs, file=self.stream, unit="model", dynamic_ncols=True)

    def update(self, total: int, results: Sequence[ModelResult], ran: bool) -> None:
        """Write ``results``' line above the bar; advance the bar when the model ran."""
        self.count += 1
        elapsed = time.monotonic() - self.start
        statuses = ", ".join(f"{r.backend} {r.status}" for r in results)
        seconds = sum(r.seconds for r in results)
        width = len(str(total))
        self.bar.write(
            f"[{self.count:>{width}}/{total}] {results[0].key:<40} {statuses:<24} "
            f"{seconds:6.1f}s  elapsed {_clock(elapsed)}",
            file=self.stream,
        )
        if ran:
            self.bar.update(1)

    def close(self) -> None:
        """Take the bar down."""
        self.bar.close()


def run_zoo(
    entries: Sequence[ZooModel],
    options: RunOptions,
    progress: Progress | None = None,
    check: Callable[[ZooModel, RunOptions], list[ModelResult]] = check_model,
    on_model: Callable[[list[ModelResult]], None] | None = None,
) -> list[ModelResult]:
    """Every entry on every selected backend, in catalogue order; ``on_model`` gets each
    model's results as soon as they are in (the run's journal)."""
    progress = progress or Progress(sum(will_run(e, options) for e in entries))
    results: list[ModelResult] = []
    try:
        for entry in entries:
            model_results = check(entry, options)
            results.extend(model_results)
            if on_model is not None:
                on_model(model_results)
            progress.update(len(entries), model_results, will_run(entry, options))
    finally:
        progress.close()
    return results


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"
