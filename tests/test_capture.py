"""Capture: deep copy, leaves, concrete args, training refusal, trace-failure messages."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxmobile
from tests.helpers import assert_equivalent, captured


class Branchy(nn.Module):
    """Data-dependent control flow: untraceable by torch.fx."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.lin(x)
        return -x


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.inner = Branchy()
        self.post = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.inner(self.pre(x)))


class Flagged(nn.Module):
    def forward(self, x: torch.Tensor, double: bool = False) -> torch.Tensor:
        if double:
            return x * 2
        return x


def test_trace_failure_names_submodule_source_line_and_fix() -> None:
    with pytest.raises(fxmobile.CaptureError) as info:
        captured(Outer().eval(), auto_leaf=False)
    msg = str(info.value)
    assert "'inner' (Branchy)" in msg
    assert "test_capture.py" in msg and "if x.sum() > 0" in msg
    assert "leaf_modules=[Branchy]" in msg and "concrete_args" in msg


def test_trace_failure_in_root_suggests_concrete_args() -> None:
    with pytest.raises(fxmobile.CaptureError, match=r"Branchy\.forward.*concrete_args"):
        captured(Branchy().eval())


@pytest.mark.parametrize("leaf", [Branchy, "inner"])
def test_leaf_module_kept_opaque(leaf: type[nn.Module] | str) -> None:
    model = Outer().eval()
    gm = captured(model, leaf_modules=[leaf]).graph_module
    called = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert called == ["pre", "inner", "post"]
    x = torch.randn(2, 4)
    assert_equivalent(model, gm, x)


def test_leaf_module_given_as_instance() -> None:
    model = Outer().eval()
    gm = captured(model, leaf_modules=[model.inner]).graph_module
    assert "inner" in [n.target for n in gm.graph.nodes if n.op == "call_module"]


def test_leaf_instance_from_another_model_is_refused() -> None:
    with pytest.raises(fxmobile.InvalidArgumentError, match="not a submodule"):
        captured(Outer().eval(), leaf_modules=[Branchy()])


def test_auto_leaf_keeps_untraceable_submodule_and_says_so() -> None:
    model = Outer().eval()
    result = fxmobile.optimize_fx(model, torch.randn(2, 4), auto_leaf=True)
    assert result.report.notes and "inner" in result.report.notes[-1]
    assert result.report.numerics_passed


def test_concrete_args_specialize_control_flow() -> None:
    gm = captured(Flagged().eval(), concrete_args={"double": True}).graph_module
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), x * 2)
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_function", "output"]


def test_concrete_args_reach_the_eager_reference() -> None:
    result = fxmobile.optimize_fx(Flagged().eval(), torch.randn(3), concrete_args={"double": True})
    assert result.report.numerics_passed


def test_training_model_is_refused_listing_what_depends_on_it() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Sequential(nn.BatchNorm1d(4)))
    model.eval()
    model[1].train()
    model[2].train()  # the Sequential itself computes the same either way; its BN does not
    with pytest.raises(fxmobile.TrainingModeError) as info:
        captured(model)
    listed = str(info.value).split("depends on it: ")[1].split(")")[0]
    assert listed == "1, 2.0"


def test_eval_copy_optimizes_an_eval_copy_and_leaves_model_training() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    assert model.training
    result = fxmobile.optimize_fx(model, torch.randn(2, 4), eval_copy=True)
    assert model.training and all(m.training for m in model.modules())
    assert result.report.numerics_passed
    assert any("eval mode" in note for note in result.report.notes)


def test_capture_never_touches_the_model() -> None:
    model = Outer().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gm = captured(model, leaf_modules=[Branchy]).graph_module
    with torch.no_grad():
        for p in gm.parameters():
            p.add_(1.0)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("bad", [42, "resnet18", torch.randn(2)])
def test_not_a_module_is_refused(bad: object) -> None:
    with pytest.raises(fxmobile.InvalidArgumentError, match=r"expected a torch\.nn\.Module"):
        captured(bad)


def test_script_module_is_refused_with_pointer_to_script_stage() -> None:
    scripted = torch.jit.script(nn.Linear(2, 2).eval())
    with pytest.raises(fxmobile.InvalidArgumentError, match="optimize_for_mobile"):
        captured(scripted)


class ScaledBy(nn.Module):
    def forward(self, x: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
        return x * factor


def test_concrete_scalar_used_as_a_value_is_baked_in() -> None:
    gm = captured(ScaledBy().eval(), concrete_args={"factor": 3.0}).graph_module
    x = torch.randn(4)
    torch.testing.assert_close(gm(x), x * 3.0)
