"""Scripting the FX result: the return annotation FX copied is dropped, ``type_as`` keeps its
alias, and a module TorchScript cannot compile is traced with the example inputs (a hooked
module alone when that is enough), or refused with what to do without them. The fallback
without torch.fx (``fallback_to_torchscript``) says which route it took and why."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import warnings
from typing import Any, ClassVar, NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import fxmobile
from fxmobile.errors import ScriptingError
from fxmobile.script.freeze import freeze
from fxmobile.script.quiet_script import quietly_script
from fxmobile.script.scripting import fallback_to_torchscript, to_torchscript
from tests.helpers import assert_equivalent, captured, randomize_batchnorm
from tests.script.common import kinds

WHOLE_TRACE = (
    "traced with the example inputs instead, so control flow is fixed to the path those inputs took"
)
TRY_BLOCK = "try blocks aren't supported:"  # the first line of TorchScript's refusal


class AnnotatedReturn(nn.Module):
    """Like googlenet: the forward's annotation names a type it does not return in eval."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x)


def test_scripting_drops_the_return_annotation_fx_copied() -> None:
    gm = captured(AnnotatedReturn().eval()).graph_module  # also resolves string annotations
    module, note = to_torchscript(gm, None)
    assert note is None
    x = torch.randn(2, 3)
    torch.testing.assert_close(module(x), gm(x))


class TypeAsWrite(nn.Module):
    def forward(self, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.type_as(like).add_(1)  # no conversion: writes y itself
        return y


def test_type_as_becomes_to_so_a_write_through_it_stays() -> None:
    model = TypeAsWrite().eval()
    gm = captured(model).graph_module
    module, _ = to_torchscript(gm, None)
    assert kinds(module)["aten::type_as"] == 0 and kinds(module)["aten::to"] == 1
    frozen = freeze(module, [])  # its dead-code elimination must keep the add_
    x, like = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(frozen(x, like), model(x, like))


class Constants(nn.Module):
    """Scripting it warns twice: about an empty container annotated in ``__init__`` (torch's
    type checker), and about a ``__constants__`` entry ``__init__`` never set (about the user's
    code: it must reach the user)."""

    __constants__: ClassVar[list[str]] = ["unset"]

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []  # not used by forward, as in torchvision

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def test_scripting_hides_only_the_deprecation_and_annotation_warnings() -> None:
    """``quietly_script`` silences torch's TorchScript deprecation and the warning torch's
    type checker gives about torchvision's ``__init__`` annotations; a warning about the
    module's own code still reaches the caller."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quietly_script(Constants().eval())
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "torch.jit.script` is deprecated" in m]
    assert not [m for m in messages if "TorchScript type system doesn't support" in m]
    assert [m for m in messages if "'unset' was found in ScriptModule constants" in m]


# --- scripting fails: the whole module traced ------------------------------------------------


class Opaque(nn.Module):
    """A leaf TorchScript cannot compile (a try block); tracing records its tensor ops."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return x + 1
        except ValueError:
            return x


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.opaque = Opaque()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.opaque(x) * 2


def _with_leaves(model: nn.Module, *leaves: type[nn.Module]) -> fx.GraphModule:
    """``model`` captured with ``leaves`` kept as module calls (of the model's class name)."""
    return captured(model.eval(), leaf_modules=leaves).graph_module


def _unscriptable_gm() -> fx.GraphModule:
    return _with_leaves(Outer(), Opaque)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace_method` is deprecated")
def test_a_module_torchscript_cannot_compile_is_traced_with_the_example_inputs() -> None:
    gm = _unscriptable_gm()
    x = torch.randn(4)
    module, note = to_torchscript(gm, (x,))
    assert note == f"scripting failed ({TRY_BLOCK}); {WHOLE_TRACE}"
    assert_equivalent(gm, module, x)


def test_without_example_inputs_it_is_refused_with_the_fix() -> None:
    with pytest.raises(
        ScriptingError,
        match=r"(?s)could not compile the optimized Outer: try blocks.*Fix: pass example_inputs",
    ):
        to_torchscript(_unscriptable_gm(), None)


class Abstract(nn.Module):
    """A base class leaving its scriptable variant to subclasses: torch.jit.script asks for it
    (``__prepare_scriptable__``) and gets an exception without text; tracing does not ask."""

    def __prepare_scriptable__(self) -> nn.Module:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3


class CallsAbstract(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.part = Abstract()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part(x) - 1


def test_a_scripting_error_without_text_is_named_by_its_type() -> None:
    gm = _with_leaves(CallsAbstract(), Abstract)
    x = torch.randn(4)
    module, note = to_torchscript(gm, (x,))
    assert note == f"scripting failed (NotImplementedError); {WHOLE_TRACE}"
    assert_equivalent(gm, module, x)


# --- traced outputs keep their structure -----------------------------------------------------


class Pair(NamedTuple):
    low: torch.Tensor
    high: torch.Tensor


class ReturnsPairs(nn.Module):
    """A NamedTuple in a list in a tuple, an int and an input returned as they are."""

    def __init__(self) -> None:
        super().__init__()
        self.opaque = Opaque()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        z = self.opaque(x) + y.sum()
        return [Pair(z - 1, z * 2)], 3, y


def test_a_traced_module_gives_its_namedtuple_back() -> None:
    """``torch.jit.trace`` returns NamedTuples as plain tuples: the traced module is wrapped in a
    scripted one that builds them again, each tensor in its place, constants as they were."""
    gm = _with_leaves(ReturnsPairs(), Opaque)
    x, y = torch.randn(4), torch.randn(3)
    module, note = to_torchscript(gm, (x, y))
    assert note == f"scripting failed ({TRY_BLOCK}); {WHOLE_TRACE}"
    assert module.original_name == "ReturnsPairs"
    (got_pairs, got_int, got_y), ([pair], _, _) = module(x, y), gm(x, y)
    assert got_int == 3 and len(got_pairs) == 1
    assert got_pairs[0]._fields == ("low", "high")
    torch.testing.assert_close(tuple(got_pairs[0]), tuple(pair))
    torch.testing.assert_close(got_y, y)


class ReturnsPairsByName(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.opaque = Opaque()

    def forward(self, x: torch.Tensor) -> dict[str, Pair]:
        z = self.opaque(x)
        return {"pair": Pair(z - 1, z * 2)}


def test_a_traced_module_gives_a_namedtuple_in_a_dict_back() -> None:
    """A NamedTuple reached only through a dict is found and built again too (found by
    mutation testing: the module that built it again was refused, "undefined value Pair", as
    torch.fx does not name the class when it writes a NamedTuple inside a dict)."""
    gm = _with_leaves(ReturnsPairsByName(), Opaque)
    x = torch.randn(4)
    module, _ = to_torchscript(gm, (x,))
    got = module(x)["pair"]
    assert got._fields == ("low", "high")
    torch.testing.assert_close(tuple(got), tuple(gm(x)["pair"]))


Scaled = collections.namedtuple("Scaled", ["value", "scale"])  # fields are Tensors to TorchScript


class ReturnsScaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.opaque = Opaque()

    def forward(self, x: torch.Tensor) -> Any:
        return Scaled(self.opaque(x), 3)


def test_a_namedtuple_torchscript_cannot_build_again_is_refused_with_the_fix() -> None:
    gm = _with_leaves(ReturnsScaled(), Opaque)
    with pytest.raises(ScriptingError, match="annotate the NamedTuple's fields") as refused:
        to_torchscript(gm, (torch.randn(4),))
    cause = refused.value.__cause__
    assert cause is not None
    first = str(cause).strip().splitlines()[0]  # torch's reason, its first line only
    assert "Scaled(Tensor value, Tensor scale)" in first
    assert (
        f"the optimized ReturnsScaled was traced (TorchScript could not compile it), which returns "
        f"NamedTuples as plain tuples, and TorchScript could not compile a module building them "
        f"again: {type(cause).__name__}: {first}. Fix:"
    ) in str(refused.value)


class ReturnsDict(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.opaque = Opaque()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        z = self.opaque(x)
        return {"low": z - 1, "high": z * 2}


def test_a_traced_module_returning_a_dict_keeps_it() -> None:
    """torch.jit.trace refuses a dict output unless it is told the structure is fixed."""
    gm = _with_leaves(ReturnsDict(), Opaque)
    x = torch.randn(4)
    module, note = to_torchscript(gm, (x,))
    assert note == f"scripting failed ({TRY_BLOCK}); {WHOLE_TRACE}"
    assert_equivalent(gm, module, x)


# --- scripting fails: hooked modules traced alone, the rest scripted ---------------------------


class Recorder:
    """A forward hook with state, which TorchScript cannot compile."""

    def __init__(self) -> None:
        self.seen: list[torch.Size] = []

    def __call__(self, module: nn.Module, args: Any, out: torch.Tensor) -> None:
        self.seen.append(out.shape)


class Transposes:
    """A forward pre-hook TorchScript cannot compile: the module gets its input transposed."""

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0].transpose(0, 1), *args[1:])


def _hooked(module: nn.Module) -> nn.Module:
    module.register_forward_hook(Recorder())
    return module


class TwoHooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = _hooked(nn.Linear(4, 4))
        self.out = _hooked(nn.Linear(4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc(x).relu())


class OneHookedInABlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(_hooked(nn.Linear(4, 4)), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) * 2


def _partly_traced(names: str, hooks: str, plural: bool = False) -> str:
    module = "modules" if plural else "module"
    return (
        f"scripting failed (TorchScript compiles plain-function hooks only, not {hooks}: "
        f"'Recorder' object has no attribute '__name__'); the hooked {module} {names} traced "
        f"with the example inputs (the hooks run at trace time), the rest scripted"
    )


def _scaled(module: nn.Module, args: Any, out: torch.Tensor, scale: float) -> torch.Tensor:
    return out * scale


class HookedByMethodAndPartial(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.recorder = Recorder()
        self.fc = nn.Linear(4, 4)
        self.fc.register_forward_hook(self.recorder.__call__)
        self.out = nn.Linear(4, 2)
        self.out.register_forward_hook(functools.partial(_scaled, scale=2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc(x))


def test_the_note_names_each_hook_torchscript_cannot_compile() -> None:
    model = HookedByMethodAndPartial()
    gm = _with_leaves(model)
    x = torch.randn(3, 4)
    module, note = to_torchscript(gm, (x,))
    assert note is not None
    assert note.startswith(
        "scripting failed (TorchScript compiles plain-function hooks only, not fc's forward hook "
        "(the bound method Recorder.__call__), out's forward hook (a functools.partial): "
    )
    assert_equivalent(model, module, x)


def test_two_hooked_modules_are_traced_alone_and_named() -> None:
    gm = _with_leaves(TwoHooked())
    x = torch.randn(3, 4)
    module, note = to_torchscript(gm, (x,))
    hooks = "fc's forward hook (a Recorder object), out's forward hook (a Recorder object)"
    assert note == _partly_traced("fc, out", hooks, plural=True)
    assert kinds(module)["aten::relu"] == 1  # scripted around the traced modules
    assert_equivalent(gm, module, x)


def test_a_nested_hooked_module_is_traced_alone_and_the_graph_module_keeps_its_own() -> None:
    gm = _with_leaves(OneHookedInABlock())
    x = torch.randn(3, 4)
    module, note = to_torchscript(gm, (x,))
    assert note == _partly_traced("block.0", "block.0's forward hook (a Recorder object)")
    assert type(gm.get_submodule("block.0")) is nn.Linear
    assert_equivalent(gm, module, x)


class HookedTransposed(nn.Module):
    """The hooked module's own pre-hook transposes its input: it must be traced with the
    arguments it is called with, before that pre-hook runs (and runs again at trace time)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = _hooked(nn.Linear(3, 2))
        self.fc.register_forward_pre_hook(Transposes())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x - 1)


def test_a_hooked_module_is_traced_with_the_arguments_before_its_pre_hooks() -> None:
    gm = _with_leaves(HookedTransposed())
    x = torch.randn(3, 5)
    module, note = to_torchscript(gm, (x,))
    hooks = "fc's forward pre-hook (a Transposes object), fc's forward hook (a Recorder object)"
    assert note == _partly_traced("fc", hooks)
    assert_equivalent(gm, module, x)


class HookedTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = _hooked(nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.fc(x).relu())


def test_a_hooked_module_called_twice_makes_the_whole_module_traced() -> None:
    """Its two calls may take different arguments; one trace is not enough for both."""
    gm = _with_leaves(HookedTwice())
    x = torch.randn(3, 4)
    module, note = to_torchscript(gm, (x,))
    assert note is not None and note.endswith(WHOLE_TRACE)
    assert_equivalent(gm, module, x)


class Branches(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x - 1


class BranchesInTheHooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.part = _hooked(Branches())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part(x) + 1


def test_a_hooked_module_whose_trace_depends_on_its_input_makes_the_whole_module_traced() -> None:
    gm = _with_leaves(BranchesInTheHooked(), Branches)
    x = torch.ones(3)
    _, note = to_torchscript(gm, (x,))
    assert note is not None and note.endswith(WHOLE_TRACE)


# --- without torch.fx: fallback_to_torchscript ------------------------------------------------


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).relu()


def test_fallback_traces_a_model_whose_trace_does_not_depend_on_the_example() -> None:
    model = Plain().eval()
    x = torch.randn(2, 4)
    fallback = fallback_to_torchscript(model, (x,))
    assert (fallback.route, fallback.declined) == ("torch.jit.trace", [])
    assert fallback.notes == [
        "torch.jit.trace fixed shapes and control flow to the example inputs'"
    ]
    assert_equivalent(model, fallback.module, x)


class BranchesWithKeywords(nn.Module):
    """A branch on a tensor (the trace depends on the example) and ``**kwargs``, which
    TorchScript cannot compile."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        y = self.fc(x)
        return y * 2 if y.sum() > 0 else y - 1


def test_fallback_traces_when_scripting_fails_and_says_the_branch_is_fixed() -> None:
    model = BranchesWithKeywords().eval()
    x = torch.randn(2, 4)
    fallback = fallback_to_torchscript(model, (x,))
    assert fallback.route == "torch.jit.trace"
    assert len(fallback.declined) == 1
    assert fallback.declined[0].startswith("torch.jit.script failed: NotSupportedError: ")
    *warned, fixed = fallback.notes
    assert warned and all(w.startswith("torch.jit.trace warned: ") for w in warned)
    assert any("Python boolean" in w for w in warned)
    assert fixed == (
        "torch.jit.trace fixed the branches the example inputs took: other inputs may take "
        "others, which the optimized module does not have"
    )
    assert_equivalent(model, fallback.module, x)


class AbstractBranches(Abstract):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x - 1


def test_fallback_names_a_scripting_error_without_text_by_its_type() -> None:
    fallback = fallback_to_torchscript(AbstractBranches().eval(), (torch.ones(3),))
    assert fallback.declined == ["torch.jit.script failed: NotImplementedError: "]


def test_fallback_without_example_inputs_scripts_a_fresh_copy_in_eval_mode() -> None:
    model = Plain()  # training mode: the user's model stays so
    fallback = fallback_to_torchscript(model, None)
    assert (fallback.route, fallback.declined, fallback.notes) == ("torch.jit.script", [], [])
    assert model.training and not fallback.module.training
    assert_equivalent(model, fallback.module, torch.randn(2, 4))


def test_fallback_without_example_inputs_names_the_model_and_the_scripting_error() -> None:
    with pytest.raises(
        ScriptingError,
        match=r"nor torch.jit.script could capture BranchesWithKeywords \(NotSupportedError: "
        r".*Fix: pass example_inputs",
    ):
        fallback_to_torchscript(BranchesWithKeywords().eval(), None)


class RefusesTracing(nn.Module):
    """Unscriptable (``**kwargs``), so only a trace could take it."""

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        assert not torch.jit.is_tracing(), "export it with torch.export\nor script it"
        return x * 2


def test_a_trace_that_fails_is_refused_naming_the_model_and_the_first_line() -> None:
    with pytest.raises(
        ScriptingError,
        match=r"torch.jit.trace could not trace the optimized RefusesTracing: AssertionError: "
        r"export it with torch.export\. Fix: make forward scriptable",
    ):
        fallback_to_torchscript(RefusesTracing().eval(), (torch.ones(3),))


class TiedProjection(nn.Module):
    """One weight under two names (in and out projections tied), an unset bias between them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.register_parameter("bias", None)
        self.weight_out = self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias: torch.Tensor | None = self.bias  # type: ignore[assignment]
        return F.linear(F.linear(x, self.weight, bias).relu(), self.weight_out)


def test_a_tied_weight_is_traced_and_stays_registered_under_its_first_name() -> None:
    """torch.jit.trace refuses a module holding one tensor under two names: the second name
    becomes a plain attribute of fxmobile's copy; the user's model keeps both."""
    model = TiedProjection().eval()
    x = torch.randn(2, 4)
    fallback = fallback_to_torchscript(model, (x,))
    assert fallback.route == "torch.jit.trace"
    assert [name for name, _ in fallback.module.named_parameters()] == ["weight"]
    assert list(dict(model.named_parameters(remove_duplicate=False))) == ["weight", "weight_out"]
    assert_equivalent(model, fallback.module, x)


class Resizes(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.resize_(x.shape[0])  # the tracer records y as a constant from here on
        return y + 1


def test_a_trace_that_records_a_value_as_a_constant_is_not_taken() -> None:
    """torch.jit.trace warns that ``resize_`` "will show up as a constant in the graph": the trace
    returns the example's result for every input. Its warning matches none of the phrases
    ``_DATA_DEPENDENT`` looked for, so the trace was taken (with the warning in the notes) and
    the result computed something else (found by mutation testing); scripting keeps the op."""
    model = Resizes().eval()
    fallback = fallback_to_torchscript(model, (torch.randn(3),))
    assert_equivalent(model, fallback.module, torch.randn(3))


class BranchesScriptably(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y * 2 if y.sum() > 0 else y - 1


def test_fallback_scripts_a_model_whose_trace_depends_on_the_example() -> None:
    model = BranchesScriptably().eval()
    x = torch.randn(2, 4)
    fallback = fallback_to_torchscript(model, (x,))
    assert (fallback.route, fallback.declined, fallback.notes) == ("torch.jit.script", [], [])
    for inputs in (x, x * 10, -x * 10):  # both branches
        assert_equivalent(model, fallback.module, inputs)


class FillsACache(nn.Module):
    """Fills a cache on its first call: the trace must record that call, on a fresh copy."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(3))
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "scale" not in self.cache:
            self.cache["scale"] = self.scale * 2
        return x * self.cache["scale"]


def test_fallback_traces_the_first_call_of_a_forward_that_fills_a_cache() -> None:
    model = FillsACache().eval()
    x = torch.randn(2, 3)
    fallback = fallback_to_torchscript(model, (x,))
    assert fallback.route == "torch.jit.trace"
    assert model.cache == {}, "the user's model was run"
    assert_equivalent(model, fallback.module, x)


@dataclasses.dataclass
class Out:
    value: torch.Tensor


class ReturnsADataclass(nn.Module):
    def forward(self, x: torch.Tensor) -> Out:
        return Out(x * 2)


def test_a_dataclass_output_is_refused_naming_the_model_and_the_class() -> None:
    with pytest.raises(
        ScriptingError, match=r"the optimized ReturnsADataclass returns a dataclass \(Out\).*Fix"
    ):
        fallback_to_torchscript(ReturnsADataclass().eval(), (torch.randn(3),))


class ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def test_a_torchscript_model_is_optimized_on_a_copy_and_left_as_it_was() -> None:
    """A ScriptModule input is cloned (state and flags) before the stage freezes and rewrites
    it: the user's module keeps its graph, its submodules and its weights."""
    eager = randomize_batchnorm(ConvBnRelu()).eval()
    model = quietly_script(eager)
    graph, state = str(model.graph), {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(model, example_inputs=x)
    assert str(model.graph) == graph and hasattr(model, "bn")
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert_equivalent(eager, result.module, x)
    assert_equivalent(eager, model, x)


class CountsCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        calls = self.calls
        assert isinstance(calls, torch.Tensor)
        calls.add_(1)  # state the output never reads
        return x * 2


def test_a_torchscript_model_that_writes_its_buffer_is_run_on_a_copy() -> None:
    """The reference outputs come from a clone with buffers of its own: running it must not
    count a call of the user's module."""
    model = quietly_script(CountsCalls().eval())
    with contextlib.suppress(fxmobile.FxMobileError):  # refusing it is fine; touching it is not
        fxmobile.optimize(model, example_inputs=torch.randn(3))
    assert model.calls.item() == 0


class OpaqueBranch(nn.Module):
    """A leaf TorchScript cannot compile whose path depends on its input's values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return x + 1 if bool(x.sum() > 0) else x - 1
        except ValueError:
            return x


class OuterBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = OpaqueBranch()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 2


def test_the_whole_graph_trace_says_what_the_tracer_warned() -> None:
    """The whole-graph trace dropped torch's tracer warnings: a leaf that branches on a value
    is fixed to the example's branch, and the note now says which value did it, as the
    fallback route's notes do."""
    gm = _with_leaves(OuterBranch(), OpaqueBranch)
    _, note = to_torchscript(gm, (torch.ones(4),))
    assert note is not None and note.endswith(WHOLE_TRACE)
    assert "torch.jit.trace warned: Converting a tensor to a Python boolean" in note
