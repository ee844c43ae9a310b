"""ExecuTorch's lowering: edge dialect, the XNNPACK partitioner, the program, and what is left.

``to_edge_transform_and_lower`` with ``XnnpackPartitioner``, then ``to_executorch``, as
ExecuTorch's own flow does; fxmobile's part is what it reads off the result. Each operator the
partitioner leaves outside every delegate runs on a portable kernel, one dispatch and one copy
per boundary on the phone; the report lists each with the reason. The reason is asked of the
partitioner itself, after lowering: the config for the op's target checks the node again while
``reasons`` listens to the ``WhyNoPartition`` records XNNPACK's configs log (DEBUG, on their
modules' loggers, kept from the caller's logging). No config for the target is ``NO_CONFIG``; a
config that declines without saying why is named; one that accepts means the node was left out
of every partition (``TAKEN_BUT_LEFT``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch import fx
from torch.export import ExportedProgram

from fxmobile.errors import LoweringError
from fxmobile.report import PortableOp, ProgramFacts

# The parent of the loggers XNNPACK's partitioner config modules report declined nodes to, each
# with its own WhyNoPartition (executorch 1.5.1).
_WHY_LOGGER = "executorch.backends.xnnpack.partition.config"
NO_CONFIG = "XNNPACK has no kernel for this operator (no partitioner config matches it)"
TAKEN_BUT_LEFT = (
    "XNNPACK's config takes it, but no partition kept it (a partition of data movement alone is "
    "not delegated)"
)
# Nodes of the lowered graph that are not operators a portable kernel runs.
_NOT_OPS = frozenset({"getitem", "executorch_call_delegate"})


@dataclass
class Lowered:
    """The program and what lowering made of the exported graph."""

    program: Any  # executorch.exir.ExecutorchProgramManager
    buffer: bytes
    facts: ProgramFacts
    edge_seconds: float  # edge dialect, partitioning and XNNPACK's serialization
    program_seconds: float  # to_executorch: memory planning and the flatbuffer
    edge_nodes: int  # operator calls left in the lowered graph (delegate calls included)


def lower(exported: ExportedProgram, name: str) -> Lowered:
    """Lower ``exported`` to an ExecuTorch program for the XNNPACK delegate."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    partitioner = XnnpackPartitioner()
    start = time.perf_counter()
    try:
        with reasons():  # the configs' records are fxmobile's to read, not the caller's to see
            edge = to_edge_transform_and_lower(exported, partitioner=[partitioner])
        middle = time.perf_counter()
        # read before to_executorch, which turns the graph into out-variants and allocations
        lowered = edge.exported_program()
        facts = program_facts(lowered, partitioner.target_partitioner_configs)
        edge_nodes = sum(1 for n in lowered.graph.nodes if n.op == "call_function")
        program = edge.to_executorch()
        buffer = bytes(program.buffer)
    except Exception as exc:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        raise LoweringError(
            f"ExecuTorch could not lower {name} for XNNPACK: {type(exc).__name__}: "
            f"{lines[0] if lines else ''}. Please report the model; the lite-interpreter file "
            f"(without target_runtime) may take it."
        ) from exc
    end = time.perf_counter()
    facts = ProgramFacts(len(buffer), facts.delegate_calls, facts.delegated_ops, facts.portable_ops)
    return Lowered(program, buffer, facts, middle - start, end - middle, edge_nodes)


def program_facts(lowered: ExportedProgram, configs: dict[str, Any]) -> ProgramFacts:
    """Delegate calls, the ops inside them, and each op left outside with its reason
    (``nbytes`` is left 0: the program is not serialized yet)."""
    graph = lowered.graph_module
    delegates = 0
    inside = 0
    outside: Counter[str] = Counter()
    reason_of: dict[str, str] = {}
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        kind = op_name(node.target)
        if kind == "executorch_call_delegate":
            delegates += 1
            backend = getattr(graph, node.args[0].target)
            inside += sum(
                1
                for n in backend.original_module.graph.nodes
                if n.op == "call_function" and op_name(n.target) not in _NOT_OPS
            )
            continue
        if kind in _NOT_OPS:
            continue
        outside[kind] += 1
        if kind not in reason_of:
            reason_of[kind] = why_outside(node, lowered, configs)
    portable = tuple(
        PortableOp(op, count, reason_of[op])
        for op, count in sorted(outside.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    return ProgramFacts(0, delegates, inside, portable)


def why_outside(node: fx.Node, lowered: ExportedProgram, configs: dict[str, Any]) -> str:
    """The partitioner's reason for leaving ``node`` out, asked of its config again."""
    from executorch.exir.backend.canonical_partitioners.config_partitioner import (
        format_target_name,
    )

    config = configs.get(format_target_name(str(getattr(node.target, "__name__", ""))))
    if config is None:
        return NO_CONFIG
    with reasons() as said:
        try:
            taken = bool(config.check_constraints(node, lowered))
        except Exception as exc:  # a config that cannot check a node is a reason too
            return f"{type(config).__name__} could not check it ({type(exc).__name__}: {exc})"
    if taken:
        return TAKEN_BUT_LEFT
    return (
        said.get(node.name) or f"{type(config).__name__}'s constraints decline it (no reason given)"
    )


def op_name(target: object) -> str:
    """``aten.native_layer_norm`` for an edge or ATen operator (``.default`` left out),
    ``getitem`` for Python's, the function's name otherwise."""
    name = str(getattr(target, "__name__", target))
    return name.removesuffix(".default")


@contextlib.contextmanager
def reasons() -> Iterator[dict[str, str]]:
    """The reason XNNPACK's configs gave per declined node name (the last one), while inside;
    their records reach no other handler meanwhile."""
    found: dict[str, str] = {}

    class Listen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            why = record.msg
            node, reason = getattr(why, "node", None), getattr(why, "reason", None)
            if node is not None and reason:
                found[str(node.name)] = str(reason).rstrip(".")

    logger = logging.getLogger(_WHY_LOGGER)
    handler = Listen(logging.DEBUG)
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield found
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
