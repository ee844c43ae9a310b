"""The TorchScript-level channels-last pass (fxmobile/script/make_inputs_channels_last.py):
ScriptModule input gets the eager route's layout; what it must leave alone, it leaves, with the
reason."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import fxmobile
from fxmobile import MobileOptimizerType
from fxmobile.report.records import PassRecord, Status
from fxmobile.script import make_inputs_channels_last as cl
from fxmobile.script.graph_utils import iter_nodes
from fxmobile.script.stage import ScriptContext
from tests.helpers import assert_equivalent, randomize_batchnorm


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn(self.conv1(x)))
        z = self.conv2(y) + y
        return z, self.fc(z.mean((2, 3)))


def _formats(module: torch.jit.ScriptModule) -> list[int]:
    """The memory_format argument of every contiguous in forward."""
    nodes = [n for n in iter_nodes(module.graph) if n.kind() == "aten::contiguous"]
    formats: list[Any] = [n.inputsAt(1).toIValue() for n in nodes]  # torch's stubs: IValue
    return [int(f) for f in formats]


def _record(result: fxmobile.MobileResult) -> PassRecord:
    return next(p for p in result.report.passes if p.name == "make_inputs_channels_last")


def _optimized(model: nn.Module, x: torch.Tensor, **kw: Any) -> fxmobile.MobileResult:
    return fxmobile.optimize(torch.jit.script(model), example_inputs=x, **kw)


def test_script_module_runs_channels_last_and_returns_eager_layout() -> None:
    model = randomize_batchnorm(_Net()).eval()
    x = torch.randn(2, 3, 12, 10)
    result = _optimized(model, x)
    assert _record(result).rewrites == 1
    # the input; both outputs (free for the logits, already contiguous)
    assert _formats(result.module) == [cl.CHANNELS_LAST, cl.CONTIGUOUS, cl.CONTIGUOUS]
    assert_equivalent(model, result.module, x)
    z, _ = result.module(x)
    assert z.is_contiguous()  # eager's layout handed back
    assert x.is_contiguous()  # the caller's tensor is untouched


def test_float64_model_keeps_float64_numerics() -> None:
    model = randomize_batchnorm(_Net()).eval().double()
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    result = _optimized(model, x)
    assert _record(result).rewrites == 1
    assert_equivalent(model, result.module, x, rel=1e-12)


def test_eager_route_is_not_converted_twice() -> None:
    model = randomize_batchnorm(_Net()).eval()
    x = torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(model, example_inputs=x)
    assert _formats(result.module).count(cl.CHANNELS_LAST) == 1
    script = _record(result)
    assert script.rewrites == 0 and dict(script.skips) == {cl.FX_ROUTE: 1}


def test_without_example_inputs_it_says_why() -> None:
    model = _Net().eval()
    result = fxmobile.optimize(torch.jit.script(model))
    assert _record(result).rewrites == 0
    assert dict(_record(result).skips) == {cl.NO_INPUTS: 1}
    assert cl.CHANNELS_LAST not in _formats(result.module)


def test_without_example_inputs_a_network_without_convolutions_says_nothing() -> None:
    """Nothing was lost by the missing example inputs: no reason to report."""
    model = nn.Sequential(nn.ReLU(), nn.AvgPool2d(2)).eval()
    result = fxmobile.optimize(torch.jit.script(model))
    assert _record(result).rewrites == 0 and dict(_record(result).skips) == {}


def test_eager_route_with_channels_last_off_keeps_eager_layout() -> None:
    model = _Net().eval()
    result = fxmobile.optimize(model, example_inputs=torch.randn(1, 3, 8, 8), channels_last=False)
    assert cl.CHANNELS_LAST not in _formats(result.module)


def test_input_already_channels_last_is_not_converted_again() -> None:
    class Converts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x.contiguous(memory_format=torch.channels_last)).contiguous()

    result = _optimized(Converts().eval(), torch.randn(1, 3, 8, 8))
    assert dict(_record(result).skips) == {cl.ALREADY: 1}
    assert _formats(result.module) == [cl.CHANNELS_LAST, cl.CONTIGUOUS]


def test_blocklist_switches_it_off() -> None:
    model = _Net().eval()
    x = torch.randn(1, 3, 8, 8)
    result = _optimized(model, x, blocklist={MobileOptimizerType.CHANNELS_LAST})
    assert cl.CHANNELS_LAST not in _formats(result.module)


class _WritesThroughView(nn.Module):
    """relu_ through a view of the conv output: a copy, not a view, once channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y.view(-1).clamp_(max=0.1)
        return y


class _ReadsStrides(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.is_contiguous():
            return y + 1
        return y - 1


class _WritesInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        x.mul_(2)
        return y


class _ReturnsAList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> list[list[torch.Tensor]]:
        return [[self.conv(x)]]


class _ReturnsADict(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.conv(x)}


class _ReadsDtype(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y + torch.ones(1, dtype=y.dtype)


class _Loops(nn.Module):
    """A loop carrying a converted value: the pass does not follow values through loops."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        for _ in range(int(x.size(0)) + 1):
            y = y * 0.5
        return y


def test_cases_that_must_be_left_alone() -> None:
    x = torch.randn(1, 3, 8, 8)
    for model, reason in (
        (
            _WritesThroughView(),
            "aten::view of a tensor written in place: a copy, not a view, once channels-last",
        ),
        (_ReadsStrides(), "a converted value reaches aten::is_contiguous, which reads strides"),
        (_WritesInput(), cl.INPUT_WRITTEN),
        (
            _ReturnsAList(),
            "an output holds converted tensors in a container fxmobile does not unpack",
        ),
        (
            _ReturnsADict(),
            "a converted value reaches prim::DictConstruct, which fxmobile cannot check",
        ),
        # prim ops are trusted only when they pack or unpack (prim::dtype has a schema: still
        # declined, the pass does not reason about what a prim op reads)
        (_ReadsDtype(), "a converted value reaches prim::dtype, which fxmobile cannot check"),
        (_Loops(), "a converted value reaches prim::Loop"),
    ):
        model.eval()
        result = _optimized(model, x.clone())
        record = _record(result)
        assert record.rewrites == 0, type(model).__name__
        assert dict(record.skips) == {reason: 1}, (type(model).__name__, record.skips)
        assert cl.CHANNELS_LAST not in _formats(result.module)
        if not isinstance(model, _WritesInput):
            assert_equivalent(model, result.module, x)


def test_a_view_that_needs_nchw_memory_undoes_the_change() -> None:
    class Flattens(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x).view(1, -1)

    model = Flattens().eval()
    x = torch.randn(1, 3, 8, 8)
    result = _optimized(model, x)
    assert _record(result).rewrites == 0
    assert dict(_record(result).skips) == {cl.CHANGED: 1}
    assert cl.CHANNELS_LAST not in _formats(result.module)
    assert_equivalent(model, result.module, x)


def test_channels_last_false_keeps_a_script_module_nchw() -> None:
    # the option reached only the FX stage: a ScriptModule was converted anyway
    model = randomize_batchnorm(_Net()).eval()
    x = torch.randn(1, 3, 16, 16)
    result = _optimized(model, x, channels_last=False)
    assert _record(result).status is Status.BLOCKLISTED
    assert _formats(result.module) == []
    assert_equivalent(model, result.module, x)


class _MixedInputs(nn.Module):
    """One input that reaches a convolution, one 4-D input that reaches none, one float."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(
        self, x: torch.Tensor, other: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv(x) * scale, other + 1


def test_only_inputs_that_reach_a_convolution_are_converted() -> None:
    """The 4-D input that meets no convolution and the float are left as they are, without a
    reason in the report (nothing to gain there is not a refusal), and only the output the
    change reaches gets a contiguous."""
    model = _MixedInputs().eval()
    inputs = (torch.randn(1, 3, 8, 8), torch.randn(1, 4, 8, 8), 0.5)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=inputs)
    record = _record(result)
    assert record.rewrites == 1 and dict(record.skips) == {}
    assert _formats(result.module) == [cl.CHANNELS_LAST, cl.CONTIGUOUS]
    assert_equivalent(model, result.module, *inputs)


class _ConvertsOneOfTwo(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.other = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + self.other(z.contiguous(memory_format=torch.channels_last))


def test_a_conversion_and_a_refusal_in_one_forward_are_both_reported() -> None:
    model = _ConvertsOneOfTwo().eval()
    inputs = (torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8))
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=inputs)
    record = _record(result)
    assert record.rewrites == 1 and dict(record.skips) == {cl.ALREADY: 1}
    assert _formats(result.module) == [cl.CHANNELS_LAST, cl.CHANNELS_LAST, cl.CONTIGUOUS]
    assert_equivalent(model, result.module, *inputs)


class _CountsCalls(nn.Module):
    """Writes its second input: a probe run on the caller's tensor would change what the next
    run computes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, calls: torch.Tensor) -> torch.Tensor:
        calls.add_(1)
        return self.conv(x) * calls


def test_the_probe_runs_on_copies_of_the_example_inputs() -> None:
    model = _CountsCalls().eval()
    x, calls = torch.randn(1, 3, 8, 8), torch.zeros(1)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=(x, calls))
    assert _record(result).rewrites == 1
    assert dict(_record(result).skips) == {}
    assert calls.item() == 0  # the caller's tensor is untouched


class _SingleOutput(nn.Module):
    """A tensor returned on its own, not in a tuple; an in-place op and a flatten on the way."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y.mul_(2.0)  # written in place, but never reshaped: nothing to miss
        pooled = torch.flatten(y.mean((2, 3), keepdim=True), 1)  # reshaped, never written
        return y + self.fc(pooled).sum()


def test_a_lone_tensor_output_is_handed_back_contiguous() -> None:
    model = _SingleOutput().eval()
    x = torch.randn(2, 3, 8, 8)
    result = _optimized(model, x)
    assert _record(result).rewrites == 1 and dict(_record(result).skips) == {}
    assert _formats(result.module) == [cl.CHANNELS_LAST, cl.CONTIGUOUS]
    assert result.module(x).is_contiguous()
    assert_equivalent(model, result.module, x)


def test_input_converted_with_to_is_not_converted_again() -> None:
    class ConvertsWithTo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x.to(memory_format=torch.channels_last))

    result = _optimized(ConvertsWithTo().eval(), torch.randn(1, 3, 8, 8))
    assert _record(result).rewrites == 0
    assert dict(_record(result).skips) == {cl.ALREADY: 1}


def test_an_input_made_contiguous_is_still_converted() -> None:
    """``x.contiguous()`` is NCHW, not a sign that the input is already channels-last."""

    class Contiguous(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x.contiguous())

    model = Contiguous().eval()
    x = torch.randn(1, 3, 8, 8)
    result = _optimized(model, x)
    assert _record(result).rewrites == 1 and dict(_record(result).skips) == {}
    assert_equivalent(model, result.module, x)


class _Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, flag: bool) -> torch.Tensor:
        y = self.conv(x)
        return y * 2 if flag else y - 1  # a prim::If with a block each


def test_both_branches_of_an_if_are_followed() -> None:
    """The if's result is a converted value (it gets the output's contiguous) though the
    condition is not."""
    model = _Branches().eval()
    x = torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=(x, False))
    assert "prim::If" in [n.kind() for n in result.module.graph.nodes()]
    assert _record(result).rewrites == 1 and dict(_record(result).skips) == {}
    assert _formats(result.module) == [cl.CHANNELS_LAST, cl.CONTIGUOUS]
    for flag in (False, True):
        assert_equivalent(model, result.module, x, flag)
        assert result.module(x, flag).is_contiguous()


class _ReadsStridesInABranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, flag: bool) -> torch.Tensor:
        y = self.conv(x)
        if flag:
            y = y + float(y.is_contiguous())
        return y


def test_a_stride_read_in_a_branch_the_examples_skip_is_declined() -> None:
    """The example inputs never run the branch, so only the graph walk can see the read."""
    model = _ReadsStridesInABranch().eval()
    x = torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=(x, False))
    assert _record(result).rewrites == 0
    reason = "a converted value reaches aten::is_contiguous, which reads strides"
    assert dict(_record(result).skips) == {reason: 1}
    for flag in (False, True):
        assert_equivalent(model, result.module, x, flag)


class _ReadsStridesLikeFormatInABranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, flag: bool) -> torch.Tensor:
        y = self.conv(x)
        if flag:
            y = y + float(torch.ops.aten.is_strides_like_format(y, torch.channels_last))
        return y


def test_is_strides_like_format_in_a_branch_the_examples_skip_is_declined() -> None:
    """``is_strides_like_format`` reads strides like ``is_contiguous``; converted, the branch
    the example inputs skip computes ``y + 1`` instead of eager's ``y``."""
    model = _ReadsStridesLikeFormatInABranch().eval()
    x = torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=(x, False))
    for flag in (False, True):
        assert_equivalent(model, result.module, x, flag)
    assert _record(result).rewrites == 0


def test_a_stride_read_the_example_inputs_run_is_never_converted() -> None:
    """Whether or not the graph walk knows the op, running the example inputs through the
    rewritten forward shows the changed values (``y + 100`` instead of ``y``)."""

    class ReadsStridesLikeFormat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x)
            return y + 100 * float(torch.ops.aten.is_strides_like_format(y, torch.channels_last))

    model = ReadsStridesLikeFormat().eval()
    x = torch.randn(1, 3, 8, 8)
    result = _optimized(model, x)
    assert _record(result).rewrites == 0
    assert cl.CHANNELS_LAST not in _formats(result.module)
    assert_equivalent(model, result.module, x)


class _LoopsBeside(nn.Module):
    """A loop that never sees a converted value, before the values that do."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        total = 0
        for i in range(n):
            total += i
        return self.conv(x) * total


def test_a_loop_that_sees_no_converted_value_is_passed_over() -> None:
    model = _LoopsBeside().eval()
    x = torch.randn(1, 3, 8, 8)
    result = fxmobile.optimize(torch.jit.script(model), example_inputs=(x, 3))
    assert _record(result).rewrites == 1 and dict(_record(result).skips) == {}
    assert _formats(result.module) == [cl.CHANNELS_LAST, cl.CONTIGUOUS]
    assert_equivalent(model, result.module, x, 3)


def test_an_output_that_was_not_contiguous_undoes_the_change() -> None:
    """Handing the output back contiguous would change its strides: declined instead."""

    class Transposes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x).transpose(2, 3)

    model = Transposes().eval()
    x = torch.randn(1, 3, 9, 8)
    result = _optimized(model, x)
    assert _record(result).rewrites == 0
    assert dict(_record(result).skips) == {cl.CHANGED: 1}
    assert cl.CHANNELS_LAST not in _formats(result.module)
    assert result.module(x).stride() == model(x).stride()


def _without_layout_passes(model: nn.Module, x: torch.Tensor) -> torch.jit.ScriptModule:
    """``model`` through the pipeline up to its layout passes: prepacked convs, NCHW."""
    blocked = {MobileOptimizerType.CHANNELS_LAST}
    return _optimized(model, x, blocklist=blocked).module


def test_example_inputs_forward_cannot_run_leave_the_graph_alone() -> None:
    """Called directly: ``optimize`` runs the model on its example inputs before any pass, so
    inputs the graph cannot run (3 channels expected, 5 given) never reach the pass there."""
    module = _without_layout_passes(_Net().eval(), torch.randn(1, 3, 8, 8))
    before = str(module.graph)
    ctx = ScriptContext(("forward",), (), (torch.randn(1, 5, 8, 8),))
    result = cl.MakeInputsChannelsLast().call(module, ctx)
    assert result.unit is module and result.rewrites == 0
    assert dict(result.skips) == {cl.NOT_CHECKED: 1}
    assert str(module.graph) == before


def test_a_module_without_forward_is_left_alone() -> None:
    """Only forward has example inputs to describe it; a preserved method is never converted,
    and nothing is reported as declined."""

    class NoForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        @torch.jit.export
        def run(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x)

    result = fxmobile.optimize(torch.jit.script(NoForward().eval()), preserved_methods=["run"])
    record = _record(result)
    assert record.status is Status.RAN
    assert record.rewrites == 0 and dict(record.skips) == {}
    graph = result.module._c._get_method("run").graph
    assert "aten::contiguous" not in [n.kind() for n in graph.nodes()]


class PairOut(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return x + 1, {"y": x * 2}


def test_same_compares_the_strides_of_tensors_inside_tuples_and_dicts() -> None:
    """The check after the rewrite looks at every tensor the graph returns: one that comes back
    channels-last inside a tuple or dict where it was contiguous is a changed module."""
    module = torch.jit.freeze(torch.jit.script(PairOut().eval()))
    x = torch.randn(1, 3, 4, 5)
    before = (x + 1, {"y": x * 2})
    assert cl.same(before, module, module.graph, [x])
    in_tuple = (before[0].contiguous(memory_format=torch.channels_last), before[1])
    in_dict = (before[0], {"y": before[1]["y"].contiguous(memory_format=torch.channels_last)})
    assert not cl.same(in_tuple, module, module.graph, [x])
    assert not cl.same(in_dict, module, module.graph, [x])
