"""What a ``.pte`` file holds, read from the file itself: delegates, kernel calls, inputs, size.

An ExecuTorch program is a flatbuffer (``Program``): one execution plan per method, each a list
of operators (``aten::cumsum.out``), delegates (a backend id and its processed blob) and chains
of instructions. A ``KernelCall`` runs ``operators[op_index]`` on a kernel the runtime links in
(the portable kernels, or ExecuTorch's own primitives for ``executorch_prim::`` ops); a
``DelegateCall`` hands a subgraph to ``delegates[delegate_index]``. Counting the instructions
gives the calls a phone makes, whatever made the file. Data outside the flatbuffer sits in
segments after it: the delegates' blobs, the constant tensors of the ops outside them, and named
data (XNNPACK keeps its packed weights there, by key, shared by the delegates that read them).

``read_program`` deserializes with ExecuTorch's own reader
(``executorch.exir._serialize._program.deserialize_pte_binary``), which moves every segment back
into the program: a delegate's blob then sits in ``backend_delegate_data``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fxmobile.errors import InvalidValueError
from fxmobile.executorch import require
from fxmobile.executorch.runtime import _DTYPES

# Bytes 4-8 of every ExecuTorch program: the flatbuffer's file identifier (schema program.fbs).
IDENTIFIER_PREFIX = b"ET"
# Operators ExecuTorch's runtime implements itself (views, scalar arithmetic), not kernels.
PRIM_NAMESPACE = "executorch_prim::"


@dataclass(frozen=True)
class Delegate:
    """One delegate of a method: the backend that runs it and the size of what it runs."""

    backend: str  # "XnnpackBackend"
    nbytes: int  # the processed blob the backend loads (for XNNPACK, its graph)
    calls: int  # DelegateCall instructions that run it


@dataclass(frozen=True)
class InputSpec:
    """One input of a method as the program fixes it (torch.export's static shapes)."""

    kind: str  # "tensor", or the value's type ("Int", "Double"...)
    shape: tuple[int, ...] = ()
    dtype: str | None = None  # "float32"; None for a type torch has no name for


@dataclass
class MethodFacts:
    """One execution plan: its inputs, its delegates and the kernel calls outside them."""

    name: str
    inputs: list[InputSpec]
    delegates: list[Delegate]
    # operator ("aten::cumsum.out") -> KernelCall instructions; executorch_prim:: ops apart
    kernel_calls: dict[str, int] = field(default_factory=dict)
    prim_calls: dict[str, int] = field(default_factory=dict)

    @property
    def delegate_calls(self) -> int:
        """Calls into delegates: one per partition the lowering made."""
        return sum(d.calls for d in self.delegates)

    @property
    def kernel_call_count(self) -> int:
        """Operator calls left on kernels outside every delegate."""
        return sum(self.kernel_calls.values())


@dataclass
class ProgramFile:
    """Everything ``fxmobile inspect`` shows about a ``.pte`` file, read from its bytes."""

    nbytes: int
    version: int  # the Program's schema version
    methods: list[MethodFacts]
    constant_bytes: int  # constant tensors of the ops outside the delegates
    named_data: int  # entries (XNNPACK's packed weights, by key)
    named_data_bytes: int

    def method(self, name: str = "forward") -> MethodFacts:
        """The method ``name``; ``InvalidValueError`` naming the methods there are."""
        for method in self.methods:
            if method.name == name:
                return method
        names = ", ".join(m.name for m in self.methods)
        raise InvalidValueError(f"the program has no method {name!r}; it has {names}")

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "methods": [
                {
                    **asdict(m),
                    "delegate_calls": m.delegate_calls,
                    "kernel_call_count": m.kernel_call_count,
                }
                for m in self.methods
            ],
        }


def is_program(path: Path) -> bool:
    """Whether ``path`` starts as an ExecuTorch program does (the identifier at byte 4)."""
    with open(path, "rb") as f:
        head = f.read(8)
    return len(head) == 8 and head[4:6] == IDENTIFIER_PREFIX


def read_program(path: Path) -> ProgramFile:
    """The facts of the ``.pte`` file at ``path``; ``InvalidValueError`` naming the file when
    it is not one ExecuTorch can read."""
    require(f"reading {path}")
    from executorch.exir._serialize._program import deserialize_pte_binary

    data = Path(path).read_bytes()
    if len(data) < 8 or data[4:6] != IDENTIFIER_PREFIX:
        raise InvalidValueError(
            f"{path} is not an ExecuTorch program (no 'ET' file identifier at byte 4); "
            f"fxmobile optimize SPEC -o model.pte writes one"
        )
    try:
        pte = deserialize_pte_binary(data)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InvalidValueError(
            f"{path}: ExecuTorch cannot read this program ({type(exc).__name__}: {first}); "
            f"is it truncated? Write it again with fxmobile optimize SPEC -o model.pte"
        ) from exc
    program = pte.program
    named = pte.named_data
    named_entries = dict(named.pte_data) if named is not None else {}
    named_bytes = sum(len(named.buffers[e.buffer_index]) for e in named_entries.values())
    return ProgramFile(
        nbytes=len(data),
        version=int(program.version),
        methods=[_method(plan, program) for plan in program.execution_plan],
        constant_bytes=sum(len(buffer.storage) for buffer in program.constant_buffer),
        named_data=len(named_entries),
        named_data_bytes=named_bytes,
    )


def _method(plan: Any, program: Any) -> MethodFacts:
    from executorch.exir.schema import DataLocation, DelegateCall, KernelCall

    kernels: Counter[str] = Counter()
    delegate_calls: Counter[int] = Counter()
    for chain in plan.chains:
        for instruction in chain.instructions:
            call = instruction.instr_args
            if isinstance(call, KernelCall):
                kernels[_operator_name(plan.operators[call.op_index])] += 1
            elif isinstance(call, DelegateCall):
                delegate_calls[call.delegate_index] += 1
    delegates = []
    for index, delegate in enumerate(plan.delegates):
        where = delegate.processed
        if where.location == DataLocation.INLINE:
            nbytes = len(program.backend_delegate_data[where.index].data)
        else:  # a segment the reader did not move back (it moves them all today)
            nbytes = int(program.segments[where.index].size)
        delegates.append(Delegate(str(delegate.id), nbytes, delegate_calls[index]))
    prims = {op: n for op, n in kernels.items() if op.startswith(PRIM_NAMESPACE)}
    ranked = sorted(((op, n) for op, n in kernels.items() if op not in prims), key=_by_count)
    return MethodFacts(
        name=str(plan.name),
        inputs=[_input(plan.values[i].val) for i in plan.inputs],
        delegates=delegates,
        kernel_calls=dict(ranked),
        prim_calls=dict(sorted(prims.items(), key=_by_count)),
    )


def _operator_name(operator: Any) -> str:
    """``aten::cumsum.out``: the name and overload as the runtime looks the kernel up."""
    return f"{operator.name}.{operator.overload}" if operator.overload else str(operator.name)


def _input(value: Any) -> InputSpec:
    from executorch.exir.schema import Tensor

    if not isinstance(value, Tensor):
        return InputSpec(type(value).__name__)
    dtype = _DTYPES.get(int(value.scalar_type))
    return InputSpec(
        "tensor",
        tuple(int(d) for d in value.sizes),
        None if dtype is None else str(dtype).removeprefix("torch."),
    )


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return (-item[1], item[0])
