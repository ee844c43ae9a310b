"""What one run of a frozen method on the example inputs says about values a frozen graph does not
describe (freezing erases dtypes and ranks, even a traced graph's).

``probe`` copies the graph, makes the copy also return each asked-for value, or facts computed
from it (``aten::dim``, ``aten::size``, ``prim::dtype``...), and runs it once on clones of the
inputs under ``no_grad``, with the graph executor's optimizations off: they profile and
re-optimize a graph for the calls after the first, and a probe's graph runs once (on resnet50
they tripled the run's time). The graph itself is not touched. Only values of the top-level block
can be asked for: a value inside an ``If`` or a loop may not exist when the method returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fxmobile.verify import clone_inputs

# An op applied to each probed value, and the type of its result.
Fact = tuple[str, Any]


def probe(
    module: torch.jit.ScriptModule,
    graph: torch._C.Graph,
    values: Sequence[torch._C.Value],
    inputs: Sequence[Any],
    facts: Sequence[Fact] = (),
) -> dict[torch._C.Value, list[Any]] | None:
    """For each of ``values`` (of ``graph``'s top-level block), the value itself when ``facts``
    is empty, else each fact's result, from one run of ``graph`` on ``inputs``; None when the
    graph does not run on them. Nothing asked for, nothing runs."""
    if not values:
        return {}
    copy = graph.copy()
    mirror = dict(zip(graph.inputs(), copy.inputs(), strict=True))
    for node, copied in zip(graph.nodes(), copy.nodes(), strict=True):
        mirror.update(zip(node.outputs(), copied.outputs(), strict=True))
    ret: Any = copy.return_node()  # torch's stubs type Node.addInput's argument as str
    returned = list(ret.inputs())
    extra = []
    for value in values:
        if not facts:
            extra.append(mirror[value])
        for kind, kind_type in facts:
            fact = copy.create(kind, [mirror[value]], 1)
            fact.insertBefore(ret)
            fact.output().setType(kind_type)
            extra.append(fact.output())
    packed = copy.create("prim::TupleConstruct", [*returned, *extra], 1)
    packed.insertBefore(ret)
    packed.output().setType(torch._C.TupleType([v.type() for v in [*returned, *extra]]))
    for _ in returned:
        ret.removeInput(0)
    ret.addInput(packed.output())
    try:
        fn = torch._C._create_function_from_graph("fxmobile_probe", copy)
        with torch.no_grad(), torch.jit.optimized_execution(False):
            found = fn(module._c, *clone_inputs(tuple(inputs)))
    except Exception:
        return None
    found = found[len(returned) :]
    per = max(len(facts), 1)
    return {value: list(found[i * per : (i + 1) * per]) for i, value in enumerate(values)}
