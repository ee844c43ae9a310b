"""An ExecuTorch program run in ExecuTorch's runtime (its Python bindings), in this process.

A method takes the flat list of the exported model's inputs and returns a flat list of
outputs; ``ProgramRunner`` takes the model's own inputs and returns its own output structure
when it knows it (the exported program's output spec), so the gate compares it with eager as
it compares any other module.

The XNNPACK delegate runs on one thread pool per process, which ``set_threads`` replaces. A
method loaded before keeps a pointer to the pool it was loaded with, and ran on freed memory
after a replacement (a segfault in ``libexecutorch_threadpool.so``), so ``set_threads`` first
releases the methods of every live runner, which load theirs again on their next call.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fxmobile.errors import InvalidValueError, LoweringError
from fxmobile.executorch.layout import canonical

_RUNNERS: weakref.WeakSet[ProgramRunner] = weakref.WeakSet()


def set_threads(threads: int) -> int:
    """Size the XNNPACK delegate's thread pool (process-wide); the size it took."""
    from executorch.extension.pybindings import portable_lib

    for runner in list(_RUNNERS):
        runner._release()
    portable_lib._unsafe_reset_threadpool(threads)
    return int(portable_lib._threadpool_get_thread_count())


class ProgramRunner:
    """``forward`` of an ExecuTorch program, called like the module it was made from."""

    def __init__(
        self,
        program: bytes | str,
        out_spec: pytree.TreeSpec | None = None,
        method: str = "forward",
    ) -> None:
        from executorch.runtime import Runtime

        try:
            loaded = Runtime.get().load_program(program)
        except Exception as exc:
            raise LoweringError(
                f"ExecuTorch's runtime could not load the program: {_first_line(exc)}"
            ) from exc
        if method not in loaded.method_names:
            raise InvalidValueError(
                f"the program has no method {method!r}; it has {sorted(loaded.method_names)}"
            )
        self.method_name = method
        self.source = program
        self.program: Any = loaded
        self.method: Any = loaded.load_method(method)
        self.out_spec = out_spec
        _RUNNERS.add(self)

    def _release(self) -> None:
        """Drop the loaded program and method (``set_threads`` is about to free their pool)."""
        self.program = self.method = None

    def input_specs(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of each tensor input the method takes, from the program."""
        from executorch.runtime import Runtime

        program = self.program or Runtime.get().load_program(self.source)
        meta = program.metadata(self.method_name)
        specs = []
        for i in range(meta.num_inputs()):
            info = meta.input_tensor_meta(i)
            specs.append((tuple(info.sizes()), _dtype(info.dtype())))
        return specs

    def __call__(self, *inputs: Any) -> Any:
        """Run the method on ``inputs`` (the model's own arguments)."""
        flat = [canonical(x) for x in program_inputs(inputs)]
        if self.method is None:  # released by set_threads: load again, on the new pool
            from executorch.runtime import Runtime

            self.program = Runtime.get().load_program(self.source)
            self.method = self.program.load_method(self.method_name)
        try:
            outputs = list(self.method.execute(flat))
        except Exception as exc:
            raise LoweringError(
                f"ExecuTorch's runtime failed to run the program's {self.method_name}: "
                f"{_first_line(exc)}"
            ) from exc
        if self.out_spec is not None:
            return pytree.tree_unflatten(outputs, self.out_spec)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def program_inputs(inputs: tuple[Any, ...]) -> list[torch.Tensor]:
    """The tensors a program's method takes, in order: torch.export flattens the arguments and
    bakes in every non-tensor one."""
    return [x for x in pytree.tree_leaves(inputs) if isinstance(x, torch.Tensor)]


# ExecuTorch's ScalarType numbers are c10's (runtime/core/portable_type/scalar_type.h).
_DTYPES = {
    0: torch.uint8,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.int64,
    5: torch.float16,
    6: torch.float32,
    7: torch.float64,
    11: torch.bool,
    15: torch.bfloat16,
}


def _dtype(scalar_type: int) -> torch.dtype:
    """A torch dtype for ExecuTorch's ScalarType number."""
    try:
        return _DTYPES[int(scalar_type)]
    except KeyError:
        raise InvalidValueError(
            f"the program takes an input of ExecuTorch ScalarType {scalar_type}, which fxmobile "
            f"cannot make inputs of; pass them yourself"
        ) from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
