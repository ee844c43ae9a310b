"""Capture's refusals before tracing: each names the culprit and the fix.

Not a module (or a class, or a ScriptModule), a module still training, a module without
``forward``, weights off the CPU or not real floating point, ``concrete_args`` that name no
parameter, ``leaf_modules`` that name no submodule, attributes that cannot be deep-copied.
"""

from __future__ import annotations

import copy
import difflib
import dis
import functools
import importlib
import inspect
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fxmobile.errors import InvalidArgumentError, InvalidValueError, TrainingModeError
from fxmobile.options import LeafSpec, Options


def admit(model: object, options: Options, *, needs_forward: bool = True) -> list[str]:
    """Every refusal of an eager model, checked once at the door; the submodules in training
    mode (refused unless ``options.eval_copy``)."""
    check_module(model)
    assert isinstance(model, nn.Module)
    if needs_forward:
        require_forward(model)
    training = require_eval(model, options.eval_copy)
    check_concrete_args(model, options.concrete_args)
    resolve_leaves(model, options.leaf_modules)
    return training


def training_submodules(model: nn.Module) -> list[str]:
    """Qualified names of the submodules in training mode whose forward depends on it
    (``<root>`` for the module itself): see ``depends_on_training``."""
    return [
        name or "<root>"
        for name, m in model.named_modules()
        if m.training and depends_on_training(m)
    ]


# Modules whose forward computes something else in training mode, whatever their code says:
# batch statistics, random masks, observers recording ranges, fake quantization learning them.
_TRAINING_KINDS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.modules.dropout._DropoutNd,
    nn.RNNBase,
    nn.MultiheadAttention,
    torch.ao.quantization.ObserverBase,
    torch.ao.quantization.FakeQuantizeBase,
)


def depends_on_training(module: nn.Module) -> bool:
    """Whether ``module``'s forward may compute something else when ``training`` is set: one
    of the kinds above, or a forward whose code reads ``self.training`` (timm's DropPath, a
    user's dropout written by hand). A module without either (a ReLU, a quantized conv after
    ``convert``, a parameter-free container) computes the same in both modes."""
    if isinstance(module, _TRAINING_KINDS):
        return True
    forward = getattr(type(module), "forward", None)
    code = getattr(forward, "__code__", None)
    return code is not None and _reads_training(code)


@functools.cache
def _reads_training(code: types.CodeType) -> bool:
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and instruction.argval == "training":
            return True
    return any(_reads_training(c) for c in code.co_consts if isinstance(c, types.CodeType))


def has_forward(model: nn.Module) -> bool:
    """False for a module that defines no ``forward`` (only exported methods, say)."""
    return getattr(type(model), "forward", None) is not nn.Module.forward


def exported_methods(model: nn.Module) -> list[str]:
    """Names of the methods decorated with ``@torch.jit.export``."""
    export = torch._jit_internal.FunctionModifiers.EXPORT
    return [
        name
        for name, fn in inspect.getmembers(type(model), inspect.isfunction)
        if torch._jit_internal.get_torchscript_modifier(fn) is export
    ]


def require_forward(model: nn.Module) -> None:
    """Refuse a module without ``forward``: torch.fx traces ``forward`` only."""
    if has_forward(model):
        return
    name = type(model).__name__
    exported = exported_methods(model)
    if exported:
        fix = (
            f"to optimize its exported methods, pass them to fxmobile.optimize (TorchScript "
            f"stage only): fxmobile.optimize(model, preserved_methods={exported!r})"
        )
    else:
        fix = "define forward, or export methods with @torch.jit.export and preserve them"
    raise InvalidArgumentError(
        f"{name} has no forward method, and torch.fx traces forward only. Fix: {fix}."
    )


def _forward_parameters(model: nn.Module) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None


def check_concrete_args(model: nn.Module, concrete_args: Mapping[str, Any] | None) -> None:
    """Every key names a parameter of ``model.forward`` (a close match is suggested)."""
    if concrete_args is None:
        return
    name = type(model).__name__
    params = _forward_parameters(model)
    if params is None or any(p.kind is p.VAR_KEYWORD for p in params):
        return
    names = [p.name for p in params if p.kind is not p.VAR_POSITIONAL]
    for key in concrete_args:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidArgumentError(
                f"concrete_args names {key!r}, which is not a parameter of {name}.forward "
                f"(its parameters: {', '.join(names) or 'none'}){hint} Fix: use the "
                f"parameter's name as the key."
            )


def eager_arguments(
    model: Any, inputs: Sequence[Any], specialized: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """How to call ``model``'s eager forward with the positional inputs of its captured form.

    The captured graph takes every remaining parameter positionally, in the order of the
    signature; the eager forward needs keyword-only ones (and any that come after a
    specialized one) by keyword.
    """
    eager = isinstance(model, nn.Module) and not isinstance(model, torch.jit.ScriptModule)
    params = _forward_parameters(model) if eager else None
    if params is None:
        return tuple(inputs), dict(specialized)
    args: list[Any] = []
    kwargs = dict(specialized)
    rest = list(inputs)
    by_keyword = False
    for param in params:
        if not rest or param.kind is param.VAR_KEYWORD:
            break
        if param.kind is param.VAR_POSITIONAL:
            args += rest
            rest = []
            break
        if param.name in specialized:
            by_keyword = True
            continue
        if param.kind is param.KEYWORD_ONLY or by_keyword:
            kwargs[param.name] = rest.pop(0)
        else:
            args.append(rest.pop(0))
    return (*args, *rest), kwargs  # extra inputs: let Python's own message say so


def require_eval(model: nn.Module, eval_copy: bool) -> list[str]:
    """The submodules still training where that changes what they compute; refused (listing
    them) unless ``eval_copy`` is set."""
    training = training_submodules(model)
    if training and not eval_copy:
        raise _training_error(type(model).__name__, training)
    return training


def _training_error(name: str, training: list[str]) -> TrainingModeError:
    shown = ", ".join(training[:8])
    if len(training) > 8:
        shown += f" and {len(training) - 8} more"
    return TrainingModeError(
        f"{name} is in training mode ({len(training)} submodules whose forward depends on it: "
        f"{shown}); mobile optimization folds inference-time constants and needs eval mode. "
        f"Call model.eval() first, or pass eval_copy=True to optimize an eval-mode copy."
    )


def admit_script_module(module: torch.jit.ScriptModule, options: Options) -> list[str]:
    """Every refusal of a ``ScriptModule``, at the door: weights fxmobile cannot fold, and
    submodules still training whose forward depends on it (freezing would fold the running
    statistics a training BatchNorm does not use, silently: upstream's optimize_for_mobile
    does), unless ``options.eval_copy``. The training submodules."""
    check_tensors(module)
    training = script_training_submodules(module)
    if training and not options.eval_copy:
        raise _training_error(str(module.original_name), training)
    return training


def script_training_submodules(module: torch.jit.ScriptModule) -> list[str]:
    """``training_submodules`` for a ``ScriptModule``: those in training mode whose methods
    read ``self.training`` (BatchNorm, dropout, a user's module) or whose class is one of the
    kinds that compute something else in training mode."""
    return [
        name or "<root>"
        for name, m in module.named_modules()
        if m.training and (_script_reads_training(m) or _script_kind_trains(m))
    ]


# A ScriptModule's pickling methods save and restore ``training`` with the rest of its state
# (torch.ao's quantized convolutions do): reading it there computes nothing.
_PICKLING = frozenset({"__getstate__", "__setstate__"})


def _script_reads_training(module: torch.jit.ScriptModule) -> bool:
    """Whether a method of ``module`` other than its pickling ones reads its ``training``
    attribute (``prim::GetAttr``)."""
    for method in set(module._c._method_names()) - _PICKLING:
        graph = module._c._get_method(method).graph
        if any(n.s("name") == "training" for n in graph.findAllNodes("prim::GetAttr")):
            return True
    return False


def _script_kind_trains(module: torch.jit.ScriptModule) -> bool:
    """Whether the Python class ``module`` was compiled from is one of ``_TRAINING_KINDS``
    (its TorchScript name is the class's, with ``__torch__.`` and mangling added)."""
    qualified = module._c._type().qualified_name()
    parts = [p for p in qualified.split(".") if p != "__torch__" and not p.startswith("___torch")]
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:split]))
            for attribute in parts[split:]:
                owner = getattr(owner, attribute)
        except (ImportError, AttributeError):
            continue
        return isinstance(owner, type) and issubclass(owner, _TRAINING_KINDS)
    return False


def check_module(model: object) -> None:
    """Refuse anything that is not an eager ``nn.Module``."""
    if isinstance(model, torch.jit.ScriptModule):
        raise InvalidArgumentError(
            f"{type(model).__name__} is already TorchScript; torch.fx cannot trace it. Pass it to "
            f"fxmobile.optimize_for_mobile, which runs only the TorchScript stage on it."
        )
    if isinstance(model, type) and issubclass(model, nn.Module):
        raise InvalidArgumentError(
            f"expected a torch.nn.Module to optimize, got the class {model.__qualname__} itself; "
            f"pass an instance in eval mode, e.g. {model.__qualname__}(...).eval()"
        )
    if not isinstance(model, nn.Module):
        raise InvalidArgumentError(
            f"expected a torch.nn.Module to optimize, got {type(model).__module__}."
            f"{type(model).__qualname__}; pass the model instance itself (model.eval()), "
            f"not its name, output or weights"
        )
    check_tensors(model)


def check_tensors(model: nn.Module) -> None:
    """Refuse weights fxmobile cannot fold or pack: off the CPU, or not real floating point.

    Applies to eager and scripted modules. Buffers may hold any dtype (indices, quantization
    zero points); parameters must be float32, float64, float16 or bfloat16. Quantized modules
    keep their weights in packed params, not in parameters, and pass.
    """
    name = type(model).__name__
    if isinstance(model, torch.jit.ScriptModule):
        name = str(model.original_name)
    tensors: list[tuple[str, str, torch.Tensor]] = [
        ("parameter", path, t) for path, t in model.named_parameters()
    ]
    tensors += [("buffer", path, t) for path, t in model.named_buffers()]
    for kind, path, tensor in tensors:
        device = tensor.device
        if device.type == "meta":
            raise InvalidValueError(
                f"{name} {kind} {path!r} is on the meta device, which holds shapes but no "
                f"values, so there is nothing to fold or pack. Fix: materialize the weights "
                f"first: model.to_empty(device='cpu'), then model.load_state_dict(...)."
            )
        if device.type != "cpu":
            raise InvalidValueError(
                f"{name} {kind} {path!r} is on {device}; fxmobile folds and packs weights on "
                f"the CPU for the mobile runtime. Fix: optimize a CPU copy: model.cpu() (and "
                f"CPU example_inputs)."
            )
        if kind == "parameter" and not tensor.is_floating_point():
            raise InvalidValueError(
                f"{name} parameter {path!r} is {str(tensor.dtype).removeprefix('torch.')}; "
                f"fxmobile folds and prepacks real floating-point weights only (float32, "
                f"float64, float16, bfloat16). Fix: convert the model (model.float()), or for "
                f"integer weights quantize it with torch.ao.quantization (quantized modules "
                f"are supported)."
            )


def resolve_leaves(
    model: nn.Module, leaf_modules: Iterable[LeafSpec]
) -> tuple[tuple[type[nn.Module], ...], set[str]]:
    """The leaf classes, and the qualified names of the leaf submodules, of ``model``.

    ``leaf_modules`` items are of the right kinds (``fxmobile.options`` checked them); here each
    instance and name must be one of ``model``'s submodules.
    """
    paths_of = {id(m): name for name, m in model.named_modules()}
    known = set(paths_of.values())
    types: list[type[nn.Module]] = []
    paths: set[str] = set()
    for spec in leaf_modules:
        if isinstance(spec, nn.Module):
            if id(spec) not in paths_of:
                raise InvalidArgumentError(
                    f"leaf module {type(spec).__name__} instance is not a submodule of "
                    f"{type(model).__name__}; pass its class or its qualified name instead"
                )
            paths.add(paths_of[id(spec)])
        elif isinstance(spec, str):
            if spec not in known:
                close = difflib.get_close_matches(spec, sorted(known - {""}), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise InvalidArgumentError(
                    f"leaf module {spec!r} is not a submodule of {type(model).__name__}; "
                    f"{hint}qualified names look like 'layer1.0.conv1'"
                )
            paths.add(spec)
        else:
            types.append(spec)
    return tuple(types), paths


def deep_copy(model: nn.Module) -> nn.Module:
    """``copy.deepcopy(model)``, or an error naming the attribute that cannot be copied.

    A tensor attribute computed from parameters with autograd on (the older
    ``torch.nn.utils.weight_norm`` keeps ``weight`` so, and recomputes it before every call)
    is not a graph leaf, which ``deepcopy`` refuses: its value is copied instead. Hooks are
    the caller's callbacks: the copy calls the same objects (deepcopy already shares plain
    functions; a callable object, a recorder say, would otherwise be copied and never see a
    call of the optimized module).
    """
    memo: dict[int, Any] = {}
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, torch.Tensor) and not value.is_leaf:
                memo[id(value)] = value.detach().clone()
        for hooks in _HOOK_DICTS:
            for hook in getattr(module, hooks).values():
                memo[id(hook)] = hook
    try:
        return copy.deepcopy(model, memo)
    except Exception as exc:
        culprit = _uncopyable_attribute(model)
        what = f"its attribute {culprit!r}" if culprit else "one of its attributes"
        raise InvalidArgumentError(
            f"could not deep-copy {type(model).__name__}: {what} cannot be copied "
            f"({type(exc).__name__}: {exc}). fxmobile never modifies your model, so it "
            f"optimizes a copy. Fix: make that attribute deep-copyable (define __deepcopy__), "
            f"or move it out of the module (e.g. a lock, file handle or client object)."
        ) from exc


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
)


def _uncopyable_attribute(model: nn.Module) -> str | None:
    for path, module in model.named_modules():
        for name, value in vars(module).items():
            if name in ("_modules", "_parameters", "_buffers"):
                continue
            try:
                copy.deepcopy(value)
            except Exception:
                return f"{path}.{name}" if path else name
        for name, value in [*module._parameters.items(), *module._buffers.items()]:
            try:
                copy.deepcopy(value)
            except Exception:
                return f"{path}.{name}" if path else name
    return None
