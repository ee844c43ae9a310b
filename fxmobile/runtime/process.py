"""A reference runtime in a child process that stays up: load a file once, then run and time it.

``RuntimeProcess("2.12.1")`` starts ``server.py`` with the python of ``.runtimes/torch-2.12.1``
and talks to it over two pipes of its own (the child's stdout and stderr go to a log that a
crash report quotes). Two torches never share a process: this one holds torch 2.15 and
fxmobile, each child one reference torch.

The child runs with ``threads`` intra-op threads (``torch.set_num_threads`` and
``OMP_NUM_THREADS``/``MKL_NUM_THREADS``) and ``OMP_WAIT_POLICY`` from this process's
environment, ``PASSIVE`` when unset: spinning OpenMP threads made 2-thread timings on a shared
2-core machine swing several-fold (see docs/pages/performance.md). It dies with this process:
Linux kills it when the thread that started it ends (``PR_SET_PDEATHSIG``, set only when that
thread is the main thread), a watchdog thread in it exits once it is orphaned, and it exits when
its request pipe closes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from fxmobile.errors import InvalidValueError
from fxmobile.runtime import install, server
from fxmobile.runtime.errors import (
    RuntimeCallError,
    RuntimeCrashedError,
    RuntimeLoadError,
    RuntimeNotInstalledError,
)

SERVER = Path(server.__file__).resolve()
_LOG_TAIL = 2000  # characters of the child's output quoted when it dies


def runtime_spec(version: str) -> install.RuntimeSpec:
    """The catalogue entry for ``version``, or an error listing the known ones."""
    try:
        return install.RUNTIMES[version]
    except KeyError:
        known = ", ".join(install.RUNTIMES)
        raise InvalidValueError(
            f"{version!r} is not a reference runtime; known: {known} (or all)"
        ) from None


def installed(version: str, runtimes_dir: Path | None = None) -> bool:
    """Whether ``version``'s venv finished installing."""
    return install.read_stamp(runtime_spec(version), runtimes_dir) is not None


def require_installed(version: str, runtimes_dir: Path | None = None) -> Path:
    """The python of ``version``'s venv; ``RuntimeNotInstalledError`` naming the fix if absent."""
    spec = runtime_spec(version)
    if install.read_stamp(spec, runtimes_dir) is None:
        where = install.venv_dir(spec, runtimes_dir)
        raise RuntimeNotInstalledError(
            f"reference runtime torch {version} is not installed (no finished install in "
            f"{where}); run `make runtimes` at the top of the fxmobile checkout (one venv per "
            f"runtime, a few GiB each; see docs/pages/runtimes.md), or point "
            f"${install.DIR_VARIABLE} at the folder that holds them"
        )
    return install.venv_python(spec, runtimes_dir)


@dataclass(frozen=True)
class RuntimeInfo:
    """What the child reported about itself when it started."""

    version: str  # the catalogue name: "1.13.1"
    torch: str  # torch.__version__ there, local suffix dropped
    python: str
    pid: int
    threads: int
    xnnpack: bool  # torch.backends.xnnpack.enabled: prepacked:: ops run on XNNPACK
    max_operator_version: int | None  # torch._C._get_max_operator_version()
    omp_wait_policy: str | None

    @property
    def kernels(self) -> str:
        """The kernels a prepacked:: op runs on there, for latency and check tables."""
        return "XNNPACK" if self.xnnpack else "ATen (no XNNPACK in this build)"

    @property
    def label(self) -> str:
        return f"torch {self.torch} (reference runtime)"


def require_peer(name: str, runtimes_dir: Path | None = None) -> Path:
    """The python of peer ``name``'s venv (``install.PEERS``); ``RuntimeNotInstalledError``
    naming ``make peers`` if absent."""
    try:
        spec = install.PEERS[name]
    except KeyError:
        known = ", ".join(install.PEERS)
        raise InvalidValueError(f"{name!r} is not a peer runtime; known: {known}") from None
    if install.read_stamp(spec, runtimes_dir) is None:
        raise RuntimeNotInstalledError(
            f"peer {name} is not installed (no finished install in "
            f"{install.venv_dir(spec, runtimes_dir)}); run `make peers` at the top of the "
            f"fxmobile checkout"
        )
    return install.venv_python(spec, runtimes_dir)


class RuntimeProcess:
    """One reference runtime, running in a child process until ``close()``.

    ``python`` and ``script`` start another venv's python on a server script of its own (a
    peer: ``script`` calls ``server.main`` with a ``Server`` subclass); ``version`` then only
    names it in messages.
    """

    def __init__(
        self,
        version: str,
        threads: int = 2,
        runtimes_dir: Path | None = None,
        *,
        python: Path | None = None,
        script: Path = SERVER,
    ) -> None:
        python = python or require_installed(version, runtimes_dir)
        if threads < 1:
            raise InvalidValueError(f"threads must be at least 1, got {threads}")
        self.version = version
        self._closed = False
        # The child's stdout and stderr, quoted when it dies; a file, so it never blocks.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        request_read, self._request_fd = os.pipe()
        self._reply_fd, reply_write = os.pipe()
        main_thread = threading.current_thread() is threading.main_thread()
        argv = [
            str(python),
            "-I",  # no PYTHONPATH, user site or script folder: only the venv's packages
            str(script),
            str(request_read),
            str(reply_write),
            str(os.getpid()),
            str(threads),
            "1" if main_thread else "0",
        ]
        try:
            self._process = subprocess.Popen(
                argv,
                pass_fds=(request_read, reply_write),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                env=_child_environment(threads),
            )
        finally:
            os.close(request_read)
            os.close(reply_write)
        self._writer: BinaryIO = os.fdopen(self._request_fd, "wb")
        self._reader: BinaryIO = os.fdopen(self._reply_fd, "rb")
        hello, _ = self._receive("start")
        if not hello["ok"]:
            self.close()
            raise RuntimeCrashedError(
                f"torch {version} did not start in {python}: {hello['error']}"
            )
        self.info = RuntimeInfo(
            version=version,
            torch=hello["torch"],
            python=hello["python"],
            pid=hello["pid"],
            threads=hello["threads"],
            xnnpack=hello["xnnpack"],
            max_operator_version=hello["max_operator_version"],
            omp_wait_policy=hello["omp_wait_policy"],
        )

    # --- requests --------------------------------------------------------------------------

    def load(self, file: Path | str | bytes, kind: str = "lite") -> LoadedFile:
        """Load a saved file there: ``lite`` (``_load_for_lite_interpreter``, what apps use) or
        ``script`` (``torch.jit.load``). ``bytes`` are written to a temporary file first.

        A refusal raises ``RuntimeLoadError`` carrying the runtime's own message.
        """
        if kind not in ("lite", "script"):
            raise InvalidValueError(f"kind must be 'lite' or 'script', got {kind!r}")
        with _as_path(file) as path:
            reply, _ = self._request({"op": "load", "path": path, "kind": kind}, fail=False)
        shown = "<bytes>" if isinstance(file, bytes) else str(file)
        if not reply["ok"]:
            loader = "lite interpreter" if kind == "lite" else "torch.jit.load"
            raise RuntimeLoadError(
                f"torch {self.version}'s {loader} cannot load {shown}: {reply['error']}",
                reply["error"],
            )
        return LoadedFile(self, reply["handle"], shown, kind)

    def upstream_optimized(
        self, scripted_file: Path | str | bytes, backend: str = "CPU", output: Path | None = None
    ) -> LoadedFile:
        """This runtime's own ``optimize_for_mobile`` applied to a TorchScript file (as
        ``torch.jit.save`` writes it), loaded in its lite interpreter; ``output`` keeps the
        lite-interpreter file it made."""
        with _as_path(scripted_file) as path:
            request = {
                "op": "upstream_optimize",
                "path": path,
                "backend": backend,
                "output": None if output is None else str(Path(output).resolve()),
            }
            reply, _ = self._request(request, fail=False)
        if not reply["ok"]:
            raise RuntimeLoadError(
                f"torch {self.version}'s optimize_for_mobile failed on "
                f"{'<bytes>' if isinstance(scripted_file, bytes) else scripted_file}: "
                f"{reply['error']}",
                reply["error"],
            )
        return LoadedFile(self, reply["handle"], "upstream optimize_for_mobile", "lite")

    def bytecode_version(self, file: Path | str | bytes) -> int:
        """The file's bytecode version as this runtime reads it."""
        with _as_path(file) as path:
            reply, _ = self._request({"op": "bytecode_version", "path": path})
        return int(reply["bytecode_version"])

    def operators(self) -> dict[str, int]:
        """Every operator this runtime registers (``aten::add.Tensor``), with its number of
        schema arguments: what its lite interpreter can resolve."""
        reply, _ = self._request({"op": "operators"})
        return {str(name): int(count) for name, count in reply["operators"].items()}

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """A request a peer's server adds (``op`` and JSON ``fields``); its reply, or
        ``RuntimeCallError`` with the message it failed with there."""
        reply, _ = self._request({"op": op, **fields})
        return reply

    def echo(self, value: Any) -> Any:
        """``value`` sent there, decoded by that torch, encoded again and decoded here."""
        buffers: list[bytes] = []
        tree = server.encode_value(value, buffers)
        reply, received = self._request({"op": "echo", "value": tree}, buffers)
        return server.decode_value(reply["value"], received)

    def close(self) -> None:
        """Stop the child (a polite exit, then a kill); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        process = getattr(self, "_process", None)
        if process is not None and process.poll() is None:
            try:
                server.write_message(self._writer, {"op": "exit"}, [])
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        for stream in ("_writer", "_reader"):
            handle = getattr(self, stream, None)
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()
        self._log.close()

    def __enter__(self) -> RuntimeProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # --- plumbing --------------------------------------------------------------------------

    def _request(
        self, header: dict[str, Any], buffers: Sequence[bytes] = (), fail: bool = True
    ) -> tuple[dict[str, Any], list[bytearray]]:
        if self._closed:
            raise RuntimeCrashedError(f"torch {self.version}'s process was closed")
        try:
            server.write_message(self._writer, header, list(buffers))
        except (BrokenPipeError, ValueError):
            raise self._crashed(header["op"]) from None
        reply, received = self._receive(header["op"])
        if fail and not reply["ok"]:
            raise RuntimeCallError(
                f"torch {self.version}: {header['op']} failed: {reply['error']}", reply["error"]
            )
        return reply, received

    def _receive(self, op: str) -> tuple[dict[str, Any], list[bytearray]]:
        try:
            return server.read_message(self._reader)
        except (EOFError, server.WireError):
            raise self._crashed(op) from None

    def _crashed(self, op: str) -> RuntimeCrashedError:
        try:
            status = self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            status = self._process.wait()
        if status < 0:
            how = f"killed by {signal.Signals(-status).name}"
        else:
            how = f"exited with status {status}"
        self._log.seek(0)
        tail = self._log.read().decode(errors="replace")[-_LOG_TAIL:].strip()
        self._closed = True
        return RuntimeCrashedError(
            f"torch {self.version}'s process {how} during {op}"
            + (f"; its last output:\n{tail}" if tail else "")
        )


class LoadedFile:
    """A file loaded in a runtime's process; calls run there on inputs sent from here."""

    def __init__(self, runtime: RuntimeProcess, handle: int, name: str, kind: str) -> None:
        self.runtime = runtime
        self.handle = handle
        self.name = name
        self.kind = kind

    def run(self, *inputs: Any, method: str = "forward") -> Any:
        """The outputs of ``method(*inputs)`` there, as tensors here (memory format not kept)."""
        buffers: list[bytes] = []
        tree = server.encode_value(tuple(inputs), buffers)
        request = {"op": "run", "handle": self.handle, "method": method, "inputs": tree}
        reply, received = self.runtime._request(request, buffers)
        return server.decode_value(reply["outputs"], received)

    def time(self, n: int, *inputs: Any, warmup: int = 0, method: str = "forward") -> list[float]:
        """Milliseconds of each of ``n`` calls there (after ``warmup`` untimed ones), all on
        the same inputs, sent once; the caller interleaves these requests with other
        candidates'."""
        if n < 1:
            raise InvalidValueError(f"n must be at least 1, got {n}")
        buffers: list[bytes] = []
        tree = server.encode_value(tuple(inputs), buffers)
        request = {
            "op": "time",
            "handle": self.handle,
            "method": method,
            "inputs": tree,
            "n": n,
            "warmup": warmup,
        }
        reply, _ = self.runtime._request(request, buffers)
        return [float(t) for t in reply["times_ms"]]

    def close(self) -> None:
        if not self.runtime._closed:
            self.runtime._request({"op": "unload", "handle": self.handle})


def _child_environment(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


@contextlib.contextmanager
def _as_path(file: Path | str | bytes) -> Iterator[str]:
    """An absolute path for ``file``; bytes go to a temporary file, removed afterwards."""
    if not isinstance(file, bytes):
        path = Path(file)
        if not path.is_file():
            raise InvalidValueError(f"{path}: no such file")
        yield str(path.resolve())
        return
    handle, temporary = tempfile.mkstemp(suffix=".ptl", prefix="fxmobile-")
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(file)
        yield temporary
    finally:
        os.unlink(temporary)
