"""SPEC -> the model to optimize and its example inputs.

Three forms:

- ``torchvision:NAME``: ``torchvision.models.get_model(NAME, weights=...)``. Without weights the
  model is randomly initialised, and its BatchNorm running statistics (mean 0, var 1 at init,
  which would hide a folding bug) are randomized by a few training-mode forwards under a fixed
  seed before ``.eval()``.
- ``path/to/file.py:NAME``: the file is imported by path and ``NAME()`` is called with no
  arguments; NAME is an ``nn.Module`` subclass or a function returning a module. Its folder goes
  on ``sys.path`` first, as with ``python file.py``. Example inputs come from ``--input-shape``
  or else from a module-level ``example_inputs()`` in the file.
- a saved TorchScript file (``.pt``/``.ptl``).

Models are built under a fixed seed (``SEED``), so one SPEC gives the same weights in
``optimize``, in ``check --model`` and in the child process ``--latency`` times in. Inputs are
``torch.randn`` of each ``--input-shape`` under the same seed; without them (and no
``example_inputs()``), the model is optimized without a numerical check.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from fxmobile.cli.common import CliError
from fxmobile.cli.script_files import load_script_module
from fxmobile.verify import randomize_batchnorm_statistics

SPEC_FORMS = "torchvision:NAME, path/to/file.py:ClassName, or a saved TorchScript file (.pt/.ptl)"
SEED = 0
_BN_FORWARDS = 2
_DEFAULT_SHAPE = (1, 3, 224, 224)
_VIDEO_SHAPE = (1, 3, 16, 112, 112)  # 16 frames
_TORCHVISION_SHAPES = {
    "inception_v3": (1, 3, 299, 299),
    # video models whose positional embeddings or kernels need 224x224 frames
    "mvit_v1_b": (1, 3, 16, 224, 224),
    "mvit_v2_s": (1, 3, 16, 224, 224),
    "s3d": (1, 3, 16, 224, 224),
}


@dataclass
class LoadedModel:
    """The model a SPEC names, in eval mode, with its example inputs (None: none known)."""

    model: nn.Module
    inputs: tuple[torch.Tensor, ...] | None
    notes: list[str] = field(default_factory=list)  # what was done to the model, for the user


def load_model(
    spec: str, input_shapes: Sequence[tuple[int, ...]] | None, weights: str | None = None
) -> LoadedModel:
    """The model ``spec`` names; ``input_shapes`` (from --input-shape) override any default."""
    shapes = list(input_shapes or [])
    if weights is not None and not spec.startswith("torchvision:"):
        raise CliError(f"--weights applies to torchvision:NAME models only, not to {spec!r}")
    if spec.startswith("torchvision:"):
        return _torchvision_model(spec.removeprefix("torchvision:"), shapes, weights)
    head, colon, tail = spec.rpartition(":")
    if colon and head.endswith(".py"):
        return _python_model(Path(head), tail, shapes)
    if spec.endswith(".py"):
        hint = _classes_hint(_import_file(Path(spec)))
        raise CliError(f"{spec}: name the model after a colon, {spec}:ClassName{hint}")
    path = Path(spec)
    if ":" in spec and not path.exists():
        prefix = spec.split(":", 1)[0]
        raise CliError(f"unknown SPEC prefix {prefix + ':'!r} in {spec!r}; SPEC is {SPEC_FORMS}")
    if not path.exists():
        raise CliError(f"{spec}: no such file; SPEC is {SPEC_FORMS}")
    module = load_script_module(path).eval()
    return LoadedModel(module, random_inputs(shapes) if shapes else None)


def absolute_spec(spec: str) -> str:
    """``spec`` with its file made absolute, so that another process (another working
    directory) finds the same model."""
    if spec.startswith("torchvision:"):
        return spec
    head, colon, tail = spec.rpartition(":")
    if colon and head.endswith(".py"):
        return f"{Path(head).resolve()}:{tail}"
    return str(Path(spec).resolve())


def random_inputs(shapes: Sequence[tuple[int, ...]]) -> tuple[torch.Tensor, ...]:
    """One ``torch.randn`` tensor per shape, drawn from a generator seeded with ``SEED``."""
    generator = torch.Generator().manual_seed(SEED)
    return tuple(torch.randn(shape, generator=generator) for shape in shapes)


def _torchvision_model(
    name: str, shapes: list[tuple[int, ...]], weights: str | None
) -> LoadedModel:
    try:
        import torchvision
    except ModuleNotFoundError:
        raise CliError(
            f"torchvision:{name} needs torchvision; install it with pip install 'fxmobile[zoo]'"
        ) from None
    known = torchvision.models.list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise CliError(
            f"torchvision has no model {name!r}{hint}; list them with "
            f"python -c 'import torchvision; print(torchvision.models.list_models())'"
        )
    chosen = _torchvision_weights(torchvision, name, weights)
    with torch.random.fork_rng():
        torch.manual_seed(SEED)  # the same random init on every run
        model: nn.Module = torchvision.models.get_model(name, weights=chosen)
    if not shapes:
        video = name in torchvision.models.list_models(module=torchvision.models.video)
        shapes = [_TORCHVISION_SHAPES.get(name, _VIDEO_SHAPE if video else _DEFAULT_SHAPE)]
    notes = []
    batchnorms = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if chosen is None and batchnorms:
        _randomize_statistics(model, shapes[0])
        notes.append(
            f"torchvision:{name} has random weights (no --weights): randomized the running "
            f"statistics of its {batchnorms} BatchNorm layers with {_BN_FORWARDS} training-mode "
            f"forwards (seed {SEED}), so BatchNorm folding is really checked"
        )
    return LoadedModel(model.eval(), random_inputs(shapes), notes)


def _torchvision_weights(torchvision: ModuleType, name: str, weights: str | None) -> Any:
    if weights is None:
        return None
    enum_type = torchvision.models.get_model_weights(name)
    if weights not in enum_type.__members__:
        valid = ", ".join(["DEFAULT", *(m.name for m in enum_type)])
        raise CliError(
            f"--weights {weights!r} is not a weight of torchvision:{name}; valid: {valid}"
        )
    return enum_type[weights]


def _randomize_statistics(model: nn.Module, shape: tuple[int, ...]) -> None:
    """``randomize_batchnorm_statistics`` with the seed, or a CliError naming the shape."""
    try:
        randomize_batchnorm_statistics(model, shape, SEED, _BN_FORWARDS)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        shown = ",".join(map(str, shape))
        raise CliError(
            f"{type(model).__name__} does not run on input {shown} ({type(exc).__name__}: "
            f"{first}); pass an --input-shape it accepts"
        ) from exc


def _python_model(path: Path, attr: str, shapes: list[tuple[int, ...]]) -> LoadedModel:
    source = _import_file(path)
    if not attr:
        raise CliError(f"{path}: name the model after the colon{_classes_hint(source)}")
    factory = getattr(source, attr, None)
    if factory is None or not callable(factory):
        raise CliError(f"{path} has no class or function {attr!r}{_classes_hint(source)}")
    _require_no_arguments(factory, path, attr)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(SEED)  # the same random init on every run, as for torchvision
            model = factory()
    except Exception as exc:
        raise CliError(f"{attr}() from {path} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise CliError(f"{attr}() from {path} returned a {type(model).__name__}, not an nn.Module")
    if shapes:
        inputs: tuple[torch.Tensor, ...] | None = random_inputs(shapes)
    else:
        inputs = _file_example_inputs(source, path)
    return LoadedModel(model.eval(), inputs)


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise CliError(f"{path}: no such file")
    name = f"_fxmobile_spec_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CliError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # TorchScript and pickling look classes up by module name
    folder = str(path.resolve().parent)
    if folder not in sys.path:  # as `python file.py` does: the file imports its neighbours
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise CliError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _require_no_arguments(factory: Any, path: Path, attr: str) -> None:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a builtin without a signature: calling it will tell
    required = [
        p.name
        for p in signature.parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if required:
        raise CliError(
            f"{attr}() needs arguments ({', '.join(required)}) but fxmobile calls it with none; "
            f"give them defaults, or add a function to {path.name} that returns the "
            f"configured model (def make_model(): return {attr}(...)) and pass "
            f"{path}:make_model"
        )


def _file_example_inputs(source: ModuleType, path: Path) -> tuple[torch.Tensor, ...] | None:
    make = getattr(source, "example_inputs", None)
    if make is None:
        return None
    if not callable(make):
        raise CliError(f"{path}: example_inputs must be a function returning the model's inputs")
    value = make()
    inputs = tuple(value) if isinstance(value, tuple | list) else (value,)
    if not all(isinstance(x, torch.Tensor) for x in inputs):
        kinds = ", ".join(type(x).__name__ for x in inputs)
        raise CliError(
            f"{path}: example_inputs() must return a tensor or a tuple of tensors, got ({kinds})"
        )
    return inputs


def _classes_hint(module: ModuleType) -> str:
    """``; nn.Module classes in it: A, B`` when the file defines any."""
    names = [
        name
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, nn.Module)
        and value.__module__ == module.__name__
    ]
    return f"; nn.Module classes defined there: {', '.join(names)}" if names else ""
