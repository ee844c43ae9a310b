"""``torch.export`` of a module fxmobile optimized, and the refusal when export cannot take it.

The exported program is ATen: one operator per idea (``aten.layer_norm``, ``aten.mean.dim``),
whatever the model's source spelled (a module, a function, a method, an index), which is what
the passes on it match. They rewrite ``unlifted(program)``, a ``GraphModule`` whose parameters
are attributes again, so that a rewrite can add a constant as a buffer; the result is exported
once more (``export_module``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import fx, nn
from torch.export import ExportedProgram

from fxmobile.errors import ExportError, RefusedError

# What to do instead, when torch.export cannot take a model: the lite-interpreter file is made
# by routes that take models export cannot (torch.jit.trace, torch.jit.script).
THE_OTHER_ROUTE = (
    "The lite-interpreter file takes such models: fxmobile.optimize(model, example_inputs=...) "
    "without target_runtime, or `fxmobile optimize SPEC -o model.ptl`."
)


def export_module(module: nn.Module, inputs: tuple[Any, ...], name: str) -> ExportedProgram:
    """``torch.export.export(module, inputs)``, static shapes; ``ExportError`` with export's
    reason (its first line, and the user's line when export names one) otherwise."""
    try:
        with warnings.catch_warnings():
            # export warns about every attribute it treats as a constant: fxmobile's folds make
            # plain tensor attributes on purpose
            warnings.filterwarnings("ignore", message=".*not a parameter or a buffer.*")
            warnings.filterwarnings("ignore", message=".*was not registered as a buffer.*")
            return torch.export.export(module, inputs, strict=False)
    except RefusedError:  # fxmobile's own refusal from inside the run (a seed call)
        raise
    except Exception as exc:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        reason = lines[0] if lines else type(exc).__name__
        raise ExportError(
            f"torch.export could not take {name}, so no ExecuTorch program can be made of it: "
            f"{type(exc).__name__}: {reason}. {THE_OTHER_ROUTE}"
        ) from exc


def functional(program: ExportedProgram) -> ExportedProgram:
    """``program`` with no op writing in place (``run_decompositions`` with an empty table:
    writes become their functional forms, ``relu_`` -> ``relu``, a write through a view ->
    ``select_scatter``), and every op kept as export recorded it (``aten.layer_norm``, not its
    decomposition), which is what the passes match."""
    return program.run_decompositions({})


def unlifted(program: ExportedProgram) -> fx.GraphModule:
    """The exported graph as a ``GraphModule`` of its own: parameters, buffers and constants
    read with ``get_attr``, inputs as placeholders."""
    module = program.module()
    assert isinstance(module, fx.GraphModule)
    return module


# Views that fail on an input whose strides they cannot take; ``reshape`` computes the same.
_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def rewritable(program: ExportedProgram) -> fx.GraphModule:
    """The functional graph of ``program``, unlifted, for passes that may change strides.

    Export records ``x.transpose(1, 2).reshape(...)`` as ``aten.view`` wherever the strides it
    saw allow a view (attention's output has the strides that make its transpose contiguous). A
    rewrite that computes the same values in another layout (attention as ``bmm``) would make
    such a view fail, so every ``view`` becomes ``reshape``, which is a view when the strides
    allow and a copy otherwise: in a functional graph nothing can tell the two apart. So does
    ``_unsafe_view``, which export records after the ``clone`` it makes of a tensor a reshape
    cannot view (a split's part): a pass that removes the clone (``remove_layout_copies``)
    would leave it a view of strides it cannot take."""
    module = unlifted(functional(program))
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target in _VIEWS:
            node.target = torch.ops.aten.reshape.default
    module.recompile()
    return module


def aten_nodes(graph: fx.Graph) -> int:
    """Operator calls in an exported graph."""
    return sum(1 for n in graph.nodes if n.op == "call_function")
