"""The child side of ``fxmobile.runtime``: one reference runtime serving requests over two pipes.

A reference runtime's venv runs this file by path (``python -I server.py READ_FD WRITE_FD
PARENT_PID THREADS DEATH_SIGNAL``); it imports nothing from fxmobile, so the same file serves
torch 1.13.1 and torch 2.12.1, and the parent (torch 2.15) imports its wire functions from here.
At module level it imports the standard library only: torch is imported inside ``main``.

Wire format, both directions. One message is a header and the buffers it lists::

    8 bytes   header length H, unsigned little-endian
    H bytes   header: a JSON object; "buffers" holds the byte length of each buffer
    ...       the buffers, back to back

Values (model inputs and outputs) travel as a JSON tree whose tensor leaves point at buffers:
``{"tensor": i, "dtype": "float32", "shape": [1, 3]}`` with buffer ``i`` holding the elements
in row-major order (memory format is not kept). Tuples, lists and dicts (keys are values too)
keep their kind; ints, floats (NaN and infinities included), bools, strings and None are
JSON scalars. Tensor bytes are read with ``ctypes.string_at`` and written back with
``torch.frombuffer``, which both torch releases have, so neither side needs numpy.

Requests are ``{"op": ...}``; every reply has ``"ok"``, and a failed one ``"error"`` (the
runtime's own message, its C++ backtrace cut off) and ``"kind"`` (the exception's class).
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

_LENGTH = struct.Struct("<Q")
# The tensor element types that travel; anything else (quantized, complex) is refused by name.
DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
)


class WireError(Exception):
    """A value that cannot travel, or a stream that ended mid-message."""


# --- framing -------------------------------------------------------------------------------


def write_message(stream: BinaryIO, header: dict[str, Any], buffers: list[bytes]) -> None:
    """One message: the JSON header's length, the header, then each buffer's bytes."""
    header = {**header, "buffers": [len(b) for b in buffers]}
    encoded = json.dumps(header).encode()
    stream.write(_LENGTH.pack(len(encoded)))
    stream.write(encoded)
    for buffer in buffers:
        stream.write(buffer)
    stream.flush()


def read_message(stream: BinaryIO) -> tuple[dict[str, Any], list[bytearray]]:
    """The next message; ``EOFError`` when the stream ended cleanly between messages."""
    prefix = stream.read(_LENGTH.size)
    if not prefix:
        raise EOFError
    (length,) = _LENGTH.unpack(_read_exactly(stream, _LENGTH.size, prefix))
    header = json.loads(bytes(_read_exactly(stream, length)))
    return header, [_read_exactly(stream, n) for n in header.pop("buffers")]


def _read_exactly(stream: BinaryIO, n: int, start: bytes = b"") -> bytearray:
    data = bytearray(n)
    view = memoryview(data)
    view[: len(start)] = start
    got = len(start)
    while got < n:
        chunk = stream.readinto(view[got:])  # type: ignore[attr-defined]
        if not chunk:
            raise WireError(f"the stream ended after {got} of {n} bytes of a message")
        got += chunk
    return data


# --- values --------------------------------------------------------------------------------


def encode_value(value: Any, buffers: list[bytes]) -> Any:
    """``value`` as a JSON tree; tensor contents are appended to ``buffers``."""
    import torch

    if isinstance(value, torch.Tensor):
        name = str(value.dtype).replace("torch.", "")
        if name not in DTYPES or value.layout != torch.strided:
            raise WireError(
                f"a {value.dtype} tensor ({value.layout}) cannot be sent; supported dtypes: "
                f"{', '.join(DTYPES)} (dequantize or convert it in the model)"
            )
        flat = value.detach().to("cpu").contiguous()
        buffers.append(ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size()))
        return {"tensor": len(buffers) - 1, "dtype": name, "shape": list(flat.shape)}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple):
        return {"tuple": [encode_value(v, buffers) for v in value]}
    if isinstance(value, list):
        return {"list": [encode_value(v, buffers) for v in value]}
    if isinstance(value, dict):
        return {
            "dict": [[encode_value(k, buffers), encode_value(v, buffers)] for k, v in value.items()]
        }
    raise WireError(
        f"a {type(value).__module__}.{type(value).__qualname__} cannot be sent; values are "
        f"tensors, numbers, strings, None, and tuples, lists and dicts of them"
    )


def decode_value(tree: Any, buffers: list[bytearray]) -> Any:
    """The value ``encode_value`` wrote; tensors own their memory (the buffer they came in)."""
    import torch

    if not isinstance(tree, dict):
        return tree
    if "tensor" in tree:
        dtype = getattr(torch, tree["dtype"])
        shape = tuple(tree["shape"])
        data = buffers[tree["tensor"]]
        if not data:  # frombuffer refuses an empty buffer
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(data, dtype=dtype).reshape(shape)
    if "tuple" in tree:
        return tuple(decode_value(v, buffers) for v in tree["tuple"])
    if "list" in tree:
        return [decode_value(v, buffers) for v in tree["list"]]
    if "dict" in tree:
        return {decode_value(k, buffers): decode_value(v, buffers) for k, v in tree["dict"]}
    raise WireError(f"not an encoded value: {sorted(tree)}")


def runtime_message(exc: BaseException) -> str:
    """``exc``'s text without the C++ backtrace torch appends ("Exception raised from ...")
    and the lite interpreter's empty "Debug info for handle(s) ... was not found" lines."""
    text = str(exc)
    for marker in ("\nException raised from ", "\nframe #0"):
        text = text.split(marker, 1)[0]
    lines = [
        line.rstrip()
        for line in text.splitlines()
        if not (line.strip().startswith("Debug info for handle(s)") and "not found" in line)
    ]
    return "\n".join(line for line in lines if line.strip()) or type(exc).__name__


# --- the server ----------------------------------------------------------------------------


class Server:
    """The child side: loaded modules by handle, and the requests that run or time them."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.modules: dict[int, Any] = {}
        self.next_handle = 0

    def hello(self) -> dict[str, Any]:
        torch = self.torch
        max_op = getattr(torch._C, "_get_max_operator_version", None)
        return {
            "torch": torch.__version__.split("+")[0],
            "python": sys.version.split()[0],
            "pid": os.getpid(),
            "threads": torch.get_num_threads(),
            "xnnpack": bool(torch.backends.xnnpack.enabled),
            "max_operator_version": None if max_op is None else int(max_op()),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        }

    def _keep(self, module: Any) -> dict[str, Any]:
        self.next_handle += 1
        self.modules[self.next_handle] = module
        return {"handle": self.next_handle}

    def load(self, request: dict[str, Any], _: list[bytearray]) -> tuple[dict[str, Any], list]:
        if request["kind"] == "lite":
            module = self.torch.jit.mobile._load_for_lite_interpreter(request["path"])
        else:
            module = self.torch.jit.load(request["path"], map_location="cpu").eval()
        return self._keep(module), []

    def upstream_optimize(self, request: dict[str, Any], _: list[bytearray]) -> tuple[dict, list]:
        """This runtime's ``optimize_for_mobile`` on a TorchScript file, run as a lite module."""
        torch = self.torch
        from torch.utils.mobile_optimizer import optimize_for_mobile

        scripted = torch.jit.load(request["path"], map_location="cpu").eval()
        optimized = optimize_for_mobile(scripted, backend=request["backend"])
        data = optimized._save_to_buffer_for_lite_interpreter()
        if request.get("output"):
            with open(request["output"], "wb") as f:
                f.write(data)
        return self._keep(torch.jit.mobile._load_for_lite_interpreter(io.BytesIO(data))), []

    def _call(self, request: dict[str, Any]) -> Callable[..., Any]:
        module = self.modules[request["handle"]]
        method = request.get("method", "forward")
        if hasattr(module, "run_method"):  # a lite module
            return lambda *args: module.run_method(method, *args)
        return getattr(module, method)

    def run(self, request: dict[str, Any], buffers: list[bytearray]) -> tuple[dict, list]:
        call = self._call(request)
        inputs = decode_value(request["inputs"], buffers)
        with self.torch.no_grad():
            outputs = call(*inputs)
        out_buffers: list[bytes] = []
        return {"outputs": encode_value(outputs, out_buffers)}, out_buffers

    def time(self, request: dict[str, Any], buffers: list[bytearray]) -> tuple[dict, list]:
        """``n`` timed calls on the same inputs (after ``warmup`` untimed ones), in ms each."""
        call = self._call(request)
        inputs = decode_value(request["inputs"], buffers)
        times = []
        with self.torch.no_grad():
            for _ in range(request.get("warmup", 0)):
                call(*inputs)
            for _ in range(request["n"]):
                start = time.perf_counter()
                call(*inputs)
                times.append((time.perf_counter() - start) * 1000)
        return {"times_ms": times}, []

    def echo(self, request: dict[str, Any], buffers: list[bytearray]) -> tuple[dict, list]:
        """The value sent, decoded by this torch and encoded again (tests the wire both ways)."""
        value = decode_value(request["value"], buffers)
        out_buffers: list[bytes] = []
        return {"value": encode_value(value, out_buffers)}, out_buffers

    def bytecode_version(self, request: dict[str, Any], _: list[bytearray]) -> tuple[dict, list]:
        version = self.torch.jit.mobile._get_model_bytecode_version(request["path"])
        return {"bytecode_version": int(version)}, []

    def operators(self, request: dict[str, Any], _: list[bytearray]) -> tuple[dict, list]:
        """Every operator this runtime registers (``name.overload``) and its argument count."""
        found = {}
        for schema in self.torch._C._jit_get_all_schemas():
            name = schema.name + ("." + schema.overload_name if schema.overload_name else "")
            found[name] = len(schema.arguments)
        return {"operators": found}, []

    def unload(self, request: dict[str, Any], _: list[bytearray]) -> tuple[dict, list]:
        self.modules.pop(request["handle"], None)
        return {}, []

    def handlers(self) -> dict[str, Callable[[dict[str, Any], list[bytearray]], tuple]]:
        """The requests served, by ``op``; a subclass (a peer's server) adds its own."""
        return {
            "load": self.load,
            "upstream_optimize": self.upstream_optimize,
            "run": self.run,
            "time": self.time,
            "echo": self.echo,
            "bytecode_version": self.bytecode_version,
            "operators": self.operators,
            "unload": self.unload,
        }


def _die_with_parent(parent_pid: int, death_signal: bool) -> None:
    """Exit once the parent is gone.

    With ``death_signal`` (the parent started this process from its main thread) Linux kills
    it when that thread ends, even mid-call; a watchdog thread also exits it once it is
    orphaned (its parent id changes), which works whichever thread started it.
    """
    if death_signal and sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="fxmobile-watchdog", daemon=True).start()


def main(argv: list[str], server_class: type[Server] | None = None) -> int:
    """Serve requests until the pipe closes; ``server_class`` (a ``Server`` subclass) lets a
    peer's script (``benchmarks/executorch_peer.py``) serve requests of its own too."""
    read_fd, write_fd, parent_pid, threads, death_signal = (int(a) for a in argv)
    _die_with_parent(parent_pid, bool(death_signal))
    reader = os.fdopen(read_fd, "rb")
    writer = os.fdopen(write_fd, "wb")
    try:
        import torch
        import torch.backends.xnnpack
        import torch.jit.mobile

        torch.set_num_threads(threads)
        server = (server_class or Server)(torch)
        write_message(writer, {"ok": True, **server.hello()}, [])
    except Exception as exc:
        write_message(
            writer, {"ok": False, "error": runtime_message(exc), "kind": type(exc).__name__}, []
        )
        return 1
    handlers = server.handlers()
    while True:
        try:
            request, buffers = read_message(reader)
        except EOFError:  # the parent closed the pipe, or died
            return 0
        if request["op"] == "exit":
            write_message(writer, {"ok": True}, [])
            return 0
        try:
            header, out_buffers = handlers[request["op"]](request, buffers)
            reply = {"ok": True, **header}
        except Exception as exc:
            reply, out_buffers = (
                {"ok": False, "error": runtime_message(exc), "kind": type(exc).__name__},
                [],
            )
        write_message(writer, reply, out_buffers)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
