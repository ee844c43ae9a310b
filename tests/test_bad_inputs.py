"""Bad input is refused with a documented exception whose message names the culprit and the fix.

Every refusal is one row of ``CASES``: the exception type (exactly), the parts of the message a
user needs (what is wrong, and what to do), and no torch ``INTERNAL ASSERT`` or bare
``AssertionError``. The user's model is bit-identical afterwards (state_dict values and training
flags), refused or not. The inputs fxmobile decided to support rather than refuse (float16 and
bfloat16 models, quantized eager models, the empty model, dict/list/tuple outputs, ``*args`` and
keyword-only inputs, a module without forward whose exported methods are preserved) have tests
of their own at the end: they optimize, on CPU, with the numbers of eager.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.ao.quantization as tq
from torch import nn

import fxmobile
from fxmobile import (
    CaptureError,
    InvalidArgumentError,
    InvalidValueError,
    MobileOptimizerType,
    TrainingModeError,
)
from fxmobile.options import UNKNOWN_BACKEND
from fxmobile.passes.remove_dropout import RemoveDropout
from tests.helpers import assert_equivalent

X = torch.randn(2, 4)


# ---------------------------------------------------------------- models users get wrong


class Branchy(nn.Module):
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.pre(x))


class LooksUpMissingKey(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.table = {"scale": 2.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.table["missing"]


class Counter(nn.Module):
    """Counts its calls in a buffer: fx's default tracer would bake ``x + 1`` in forever."""

    n: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n.add_(1)
        return x + self.n


class RunningMean(nn.Module):
    """Writes a traced value into a buffer: fx records ``copy_`` on the attribute."""

    mean: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mean.copy_(x.mean())
        return x - self.mean


class ReassignsBuffer(nn.Module):
    n: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n = self.n + 1
        return x + self.n


class CountsCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x)


class CachesInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cache: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.append(x)
        return x * 2


class TrainsItself(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.lin.weight.mul_(0.5)
        return self.lin(x)


class NoForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @torch.jit.export
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Scaled(nn.Module):
    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x * scale


class WithExtra(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)

    @torch.jit.export
    def extra(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class HoldsLock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.lock = threading.Lock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class ReturnsNothing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> None:
        self.lin(x)


class IntegerWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.offsets = nn.Parameter(torch.arange(4), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.offsets


def linear() -> nn.Module:
    return nn.Linear(4, 4).eval()


def half_training() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.ReLU()).eval()
    model[1].train()
    return model


def eval_but_batchnorm_training() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval()
    model[1].train()
    return model


class ScalesInTraining(nn.Module):
    """A user's module whose forward reads ``self.training``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5 if self.training else x


def eval_but_reads_training() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 4), ScalesInTraining()).eval()
    model[1].train()
    return model


def stateful_inside() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), Counter()).eval()


class QuantNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv = nn.Conv2d(3, 4, 3)
        self.relu = nn.ReLU()
        self.dequant = tq.DeQuantStub()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dequant(self.relu(self.conv(self.quant(x))))


def quantized(eval_after_convert: bool = True) -> nn.Module:
    """Eager-mode static quantization; ``convert`` makes new modules, in training mode."""
    model = QuantNet().eval()
    model.qconfig = tq.get_default_qconfig("x86")
    tq.prepare(model, inplace=True)
    with torch.no_grad():
        model(torch.randn(2, 3, 8, 8))
    tq.convert(model, inplace=True)
    return model.eval() if eval_after_convert else model


# ---------------------------------------------------------------- the table of refusals


@dataclass(frozen=True)
class Bad:
    name: str
    model: Callable[[], Any]
    call: Callable[[Any], object]
    error: type[BaseException]
    parts: tuple[str, ...]
    builtin: type[BaseException]  # what an `except` written for upstream catches

    def __str__(self) -> str:
        return self.name


def opt(**kw: Any) -> Callable[[Any], object]:
    return lambda m: fxmobile.optimize(m, **kw)


def opt_fx(*args: Any, **kw: Any) -> Callable[[Any], object]:
    return lambda m: fxmobile.optimize_fx(m, *args, **kw)


def scripted(make: Callable[[], nn.Module]) -> Callable[[], torch.jit.ScriptModule]:
    return lambda: torch.jit.script(make())


TE, VE, RE = TypeError, ValueError, RuntimeError
CASES = [
    Bad("not_a_module", lambda: 42, opt(), InvalidArgumentError,
        ("expected a torch.nn.Module", "builtins.int", "pass the model instance"), TE),
    Bad("module_class_not_instance", lambda: nn.Linear, opt(), InvalidArgumentError,
        ("the class Linear itself", "Linear(...).eval()"), TE),
    Bad("training_mode", half_training, opt(example_inputs=X), TrainingModeError,
        ("in training mode (1 submodules whose forward depends on it: 1)", "model.eval()",
         "eval_copy=True"), VE),
    Bad("untraceable_control_flow", lambda: Outer().eval(), opt_fx(X, auto_leaf=False),
        CaptureError,
        ("submodule 'inner' (Branchy)", "test_bad_inputs.py", "if x.sum() > 0",
         "leaf_modules=[Branchy]", "concrete_args"), RE),
    Bad("python_error_while_tracing", lambda: LooksUpMissingKey().eval(), opt_fx(),
        CaptureError, ("LooksUpMissingKey.forward", "test_bad_inputs.py",
                       'self.table["missing"]', "KeyError", "fix it there"), RE),
    Bad("python_error_on_the_example_inputs", lambda: LooksUpMissingKey().eval(), opt_fx(X),
        InvalidValueError, ("LooksUpMissingKey.forward", "test_bad_inputs.py",
                            'self.table["missing"]', "KeyError", "fix it there"), VE),
    Bad("buffer_changed_in_place", lambda: Counter().eval(), opt_fx(X),
        CaptureError, ("buffer 'n' (changed in place)", "self.n.add_(1)",
                       "keep the state outside the model"), RE),
    Bad("buffer_written_with_traced_value", lambda: RunningMean().eval(), opt_fx(X),
        CaptureError, ("'mean' (written in place by copy_)", "self.mean.copy_(x.mean())",
                       "keep the state outside the model"), RE),
    Bad("buffer_reassigned", lambda: ReassignsBuffer().eval(), opt_fx(X), CaptureError,
        ("buffer 'n' (reassigned)", "take it as an input and return the new value"), RE),
    Bad("attribute_counter", lambda: CountsCalls().eval(), opt_fx(X), CaptureError,
        ("attribute 'calls' (reassigned)", "keep the state outside the model"), RE),
    Bad("attribute_list_appended", lambda: CachesInputs().eval(), opt_fx(X), CaptureError,
        ("attribute 'cache' (changed in place)",), RE),
    Bad("parameter_changed_in_place", lambda: TrainsItself().eval(), opt_fx(X), CaptureError,
        ("'lin.weight' (written in place by mul_)", "self.lin.weight.mul_(0.5)",
         "leaf_modules=[Linear]"), RE),
    Bad("stateful_submodule", stateful_inside, opt_fx(X), CaptureError,
        ("buffer '1.n' (changed in place)", "self.n.add_(1)", "leaf_modules=[Counter]"), RE),
    Bad("missing_preserved_methods", linear, opt(preserved_methods=["a", "b"]), AttributeError,
        ("The following methods to preserve do not exist in script_module: a, b",),
        AttributeError),
    Bad("missing_preserved_method_scripted", scripted(linear),
        lambda m: fxmobile.optimize_for_mobile(m, preserved_methods=["predict"]),
        AttributeError,
        ("The following methods to preserve do not exist in script_module: predict",),
        AttributeError),
    Bad("preserved_methods_single_string", lambda: WithExtra().eval(),
        opt(preserved_methods="extra"), InvalidArgumentError,
        ("single name 'extra'", "wrap it: ['extra']"), TE),
    Bad("unknown_backend", linear, opt(backend="tpu"), InvalidArgumentError,
        (UNKNOWN_BACKEND, "'tpu'"), TE),
    Bad("blocklist_string", linear, opt(blocklist=["remove_dropout"]),
        InvalidArgumentError, ("'remove_dropout' is not an optimization",
                               "fxmobile.MobileOptimizerType.REMOVE_DROPOUT"), TE),
    Bad("blocklist_pass_class", linear, opt(blocklist=[RemoveDropout]),
        InvalidArgumentError, ("RemoveDropout", "is not an optimization",
                               "fxmobile.MobileOptimizerType"), TE),
    Bad("blocklist_int", linear, opt(blocklist=[3]), InvalidArgumentError,
        ("blocklist item 3 is not an optimization", "REMOVE_DROPOUT"), TE),
    Bad("blocklist_single_member", linear,
        opt(blocklist=MobileOptimizerType.REMOVE_DROPOUT), InvalidArgumentError,
        ("single value", "wrap it: {MobileOptimizerType.REMOVE_DROPOUT}"), TE),
    Bad("example_inputs_wrong_shape", linear, opt(example_inputs=torch.randn(2, 5)),
        InvalidValueError, ("example_inputs do not run through Linear.forward", "(2, 5)",
                            "pass example_inputs that the eager model accepts"), VE),
    Bad("example_inputs_wrong_shape_scripted", scripted(linear),
        opt(example_inputs=torch.randn(2, 5)), InvalidValueError,
        ("example_inputs do not run through Linear.forward (RuntimeError: addmm", "(2, 5)"), VE),
    Bad("example_inputs_wrong_shape_preserved", lambda: WithExtra().eval(),
        opt(preserved_methods=["extra"], example_inputs=torch.randn(2, 5)), InvalidValueError,
        ("example_inputs do not run through WithExtra.forward", "(2, 5)"), VE),
    Bad("example_inputs_wrong_type", linear, opt(example_inputs="an image"), InvalidValueError,
        ("example_inputs do not run through Linear.forward", "['str']", "must be Tensor"), VE),
    Bad("example_inputs_on_other_device", linear, opt(example_inputs=X.to("meta")),
        InvalidValueError, ("example_inputs[0] is on meta", "pass CPU tensors"), VE),
    Bad("model_on_meta_device", lambda: nn.Linear(4, 4, device="meta").eval(), opt(),
        InvalidValueError, ("parameter 'weight' is on the meta device",
                            "model.to_empty(device='cpu')", "load_state_dict"), VE),
    Bad("scripted_model_on_meta_device", scripted(lambda: nn.Linear(4, 4, device="meta")),
        opt(), InvalidValueError, ("parameter 'weight' is on the meta device",), VE),
    Bad("complex_weights", lambda: nn.Linear(4, 4, dtype=torch.complex64).eval(),
        opt(example_inputs=X.to(torch.complex64)), InvalidValueError,
        ("parameter 'weight' is complex64", "real floating-point weights only",
         "model.float()"), VE),
    Bad("integer_parameter", lambda: IntegerWeight().eval(), opt_fx(X), InvalidValueError,
        ("parameter 'offsets' is int64", "torch.ao.quantization"), VE),
    Bad("no_forward", lambda: NoForward().eval(), opt(), InvalidArgumentError,
        ("NoForward has no forward method", "preserved_methods=['predict']"), TE),
    Bad("concrete_args_unknown_name", lambda: Scaled().eval(),
        opt_fx(X, concrete_args={"sclae": 2.0}), InvalidArgumentError,
        ("concrete_args names 'sclae'", "its parameters: x, scale", "did you mean 'scale'?"), TE),
    Bad("concrete_args_not_a_dict", lambda: Scaled().eval(), opt_fx(X, concrete_args=[2.0]),
        InvalidArgumentError, ("concrete_args must be a dict", "got list"), TE),
    Bad("leaf_modules_bad_entry", lambda: Outer().eval(), opt_fx(X, leaf_modules=[42]),
        InvalidArgumentError, ("leaf_modules items must be nn.Module classes", "got 42"), TE),
    Bad("leaf_modules_unknown_name", lambda: Outer().eval(), opt_fx(X, leaf_modules=["iner"]),
        InvalidArgumentError,
        ("leaf module 'iner' is not a submodule of Outer", "did you mean 'inner'?"), TE),
    Bad("leaf_modules_single_name", lambda: Outer().eval(), opt_fx(X, leaf_modules="inner"),
        InvalidArgumentError, ("single value 'inner'", "wrap it: leaf_modules=['inner']"), TE),
    Bad("negative_tolerance", linear, opt(example_inputs=X, tolerance=-1e-4),
        InvalidValueError, ("tolerance must be a non-negative number", "-0.0001"), VE),
    Bad("nan_tolerance", linear, opt_fx(X, tolerance=float("nan")), InvalidValueError,
        ("tolerance must be a non-negative number", "nan"), VE),
    Bad("negative_tolerance_scripted", scripted(linear), opt(example_inputs=X, tolerance=-1),
        InvalidValueError, ("tolerance must be a non-negative number",), VE),
    Bad("tolerance_not_a_number", linear, opt_fx(X, tolerance="1e-4"), InvalidArgumentError,
        ("tolerance must be a non-negative number", "str '1e-4'"), TE),
    Bad("script_module_to_optimize_fx", scripted(linear), opt_fx(X), InvalidArgumentError,
        ("already TorchScript", "fxmobile.optimize_for_mobile"), TE),
    Bad("scripted_batchnorm_training", scripted(eval_but_batchnorm_training), opt(),
        TrainingModeError, ("Sequential is in training mode", "1 submodules", ": 1)",
                            "model.eval()", "eval_copy=True"), VE),
    Bad("scripted_dropout_training", scripted(half_training), fxmobile.optimize_for_mobile,
        TrainingModeError, ("in training mode", ": 1)", "model.eval()"), VE),
    Bad("scripted_reads_self_training", scripted(eval_but_reads_training),
        opt(example_inputs=X), TrainingModeError, ("in training mode", ": 1)",
                                                   "eval_copy=True"), VE),
    Bad("attribute_cannot_be_deep_copied", lambda: HoldsLock().eval(), opt(example_inputs=X),
        InvalidArgumentError, ("could not deep-copy HoldsLock", "attribute 'lock'",
                               "_thread.lock", "move it out of the module"), TE),
    Bad("forward_returns_none", lambda: ReturnsNothing().eval(), opt(example_inputs=X),
        InvalidValueError, ("ReturnsNothing.forward returns None", "is a `return` missing?"), VE),
]  # fmt: skip


Snapshot = tuple[dict[str, torch.Tensor], dict[str, bool]]


def snapshot(model: object) -> Snapshot | None:
    """State-dict bits and training flags; None when it is not a module (nothing to compare)."""
    if not isinstance(model, nn.Module):
        return None
    state = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    flags = {name: m.training for name, m in model.named_modules()}
    return state, flags


def assert_same_snapshot(before: Snapshot | None, after: Snapshot | None) -> None:
    if before is None or after is None:
        assert after is before
        return
    (state0, flags0), (state1, flags1) = before, after
    assert flags1 == flags0
    assert state1.keys() == state0.keys()
    for key, value in state0.items():
        now = state1[key]
        assert now.dtype == value.dtype and now.device == value.device, key
        if value.device.type != "meta":
            assert torch.equal(now, value), f"{key} changed"


def test_the_table_has_at_least_twenty_distinct_cases() -> None:
    names = [case.name for case in CASES]
    assert len(set(names)) == len(names) >= 20


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_is_refused_clearly(case: Bad) -> None:
    model = case.model()
    before = snapshot(model)
    with pytest.raises(BaseException) as info:
        case.call(model)
    err = info.value
    message = str(err)
    assert type(err) is case.error, f"{type(err).__name__}: {message}"
    assert isinstance(err, case.builtin)
    if case.error not in (AttributeError,):
        assert isinstance(err, fxmobile.FxMobileError)
    for part in case.parts:
        assert part in message, f"{part!r} not in: {message}"
    assert "INTERNAL ASSERT" not in message
    assert not isinstance(err, AssertionError)
    assert_same_snapshot(before, snapshot(model))


def test_unknown_backend_speaks_upstreams_words() -> None:
    with pytest.raises(TypeError) as info:
        fxmobile.optimize_for_mobile(linear(), backend="Vulcan")
    assert str(info.value).startswith(UNKNOWN_BACKEND)


def test_missing_preserved_methods_message_is_upstreams_exactly() -> None:
    with pytest.raises(AttributeError) as info:
        fxmobile.optimize_for_mobile(torch.jit.script(linear()), preserved_methods=["a", "b"])
    assert str(info.value) == (
        "The following methods to preserve do not exist in script_module: a, b"
    )


# ---------------------------------------------------------------- supported, not refused


@pytest.mark.parametrize(
    ("dtype", "rel"), [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)], ids=["fp16", "bf16"]
)
def test_half_precision_models_optimize(dtype: torch.dtype, rel: float) -> None:
    """The folding and packing passes keep the model's dtype; half precision works."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 6 * 6, 5)).eval()  # fmt: skip
    model = model.to(dtype)
    x = torch.randn(2, 3, 8, 8, dtype=dtype)
    result = fxmobile.optimize(model, example_inputs=x)
    assert result.report.numerics_passed is not None
    out = result.module(x)
    assert out.dtype == dtype
    assert_equivalent(model, result.module, x, rel=rel)


def test_quantized_eager_model_optimizes_with_quantized_modules_as_leaves() -> None:
    """torch.fx keeps quantized modules (and the quant stubs) as leaf calls; the TorchScript
    stage then sees ``quantized::conv2d`` exactly as for a scripted quantized model."""
    model = quantized()
    x = torch.randn(2, 3, 8, 8)
    result = fxmobile.optimize(model, example_inputs=x)
    assert result.report.numerics_passed
    assert result.report.ops_after and result.report.ops_after.get("quantized::conv2d") == 1
    with torch.no_grad():
        assert torch.equal(result.module(x), model(x))
    from_script = fxmobile.optimize(torch.jit.script(quantized()), example_inputs=x)
    assert from_script.report.numerics_passed


def test_empty_model_is_the_identity() -> None:
    result = fxmobile.optimize(nn.Sequential().eval(), example_inputs=X)
    assert result.report.numerics_passed
    assert torch.equal(result.module(X), X)


class Structured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        y = torch.relu(self.bn(self.conv(x)))
        return {"features": y, "pooled": [y.mean((2, 3)), (y.amax((2, 3)), y.sum())]}


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        y = self.lin(x)
        return y, [y.relu(), y * 2]


@pytest.mark.parametrize(
    ("make", "x"),
    [(Structured, torch.randn(2, 3, 8, 8)), (Pair, X)],
    ids=["dict_of_list_of_tuple", "tuple_of_list"],
)
def test_non_tensor_outputs_work_end_to_end(make: Callable[[], nn.Module], x: Any) -> None:
    from tests.helpers import randomize_batchnorm

    model = randomize_batchnorm(make()).eval()
    result = fxmobile.optimize(model, example_inputs=x)
    assert result.report.numerics_passed
    assert_equivalent(model, result.module, x)
    fx_result = fxmobile.optimize_fx(model, x)
    assert fx_result.report.numerics_passed
    assert_equivalent(model, fx_result.graph_module, x)


def test_module_without_forward_optimizes_its_preserved_methods() -> None:
    model = NoForward().eval()
    result = fxmobile.optimize(model, preserved_methods=["predict"], example_inputs=X)
    assert any("no forward" in note for note in result.report.notes)
    assert_equivalent(model.predict, result.module.predict, X)
    assert result.report.ops_after and "prepacked::linear_clamp_run" in result.report.ops_after


class VarArgs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, *args: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.lin(args[0]) + args[1]


class KeywordOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + bias


def test_varargs_forward_works() -> None:
    model = VarArgs().eval()
    result = fxmobile.optimize(model, example_inputs=(X, X))
    assert result.report.numerics_passed
    assert_equivalent(model, result.module, X, X)


def test_keyword_only_inputs_are_taken_in_signature_order() -> None:
    """The optimized module takes ``bias`` positionally (or by keyword); the eager reference is
    called with it by keyword."""
    model = KeywordOnly().eval()
    bias = torch.randn(4)
    result = fxmobile.optimize(model, example_inputs=(X, bias))
    assert result.report.numerics_passed
    with torch.no_grad():
        expected = model(X, bias=bias)
        torch.testing.assert_close(result.module(X, bias), expected)
        torch.testing.assert_close(result.module(X, bias=bias), expected)


def test_concrete_arg_before_a_positional_input_is_passed_by_keyword() -> None:
    class Gated(nn.Module):
        def forward(self, x: torch.Tensor, gate: bool, y: torch.Tensor) -> torch.Tensor:
            return x + y if gate else x - y

    result = fxmobile.optimize_fx(Gated().eval(), (X, X), concrete_args={"gate": False})
    assert result.report.numerics_passed
    torch.testing.assert_close(result.graph_module(X, X), torch.zeros_like(X))


def test_a_counter_through_optimize_is_traced_from_the_callers_count() -> None:
    """A buffer that counts calls: torch.fx cannot keep the write, torch.jit.trace does; the
    module comes back counting from the caller's 0, as eager does (it was refused as a
    mismatch while fxmobile's own runs advanced its copy's counter)."""
    model = Counter().eval()
    result = fxmobile.optimize(model, example_inputs=X)
    assert result.report.route == "torch.jit.trace"
    assert float(model.n) == 0 and float(result.module.n) == 0
    with torch.no_grad():
        for calls in (1, 2, 3):
            assert torch.equal(result.module(X), X + calls)


def test_a_scripted_module_optimizes_an_eval_copy_with_eval_copy() -> None:
    model = torch.jit.script(eval_but_batchnorm_training())
    result = fxmobile.optimize(model, example_inputs=X, eval_copy=True)
    assert model[1].training, "the caller's module is left as it was"
    reference = torch.jit.script(eval_but_batchnorm_training()).eval()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.allclose(result.module(X), reference(X), atol=1e-5)
