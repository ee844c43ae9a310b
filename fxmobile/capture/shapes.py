"""Shape-aware tracing: every proxy carries a fake tensor, so shape questions have answers.

Plain ``torch.fx`` tracing fails on code that asks a traced value for its shape and branches on
the answer (``if h % self.stride != 0``), turns it into a Python number (``int(x.shape[-2])``,
``math.ceil(w / s)``), iterates a traced tuple (``list(x.chunk(2, 1))``), or is written with
``*args`` / ``**kwargs``. With example inputs those questions have one answer each: the shapes
the example inputs give. ``ShapeTracer`` runs each recorded op once more on fake tensors (a
``FakeTensorMode``: shapes, dtypes and strides, no data, no cost) and attaches the result to its
proxy; ``size()``, ``shape``, ``dim()``, ``numel()``, ``dtype``, ``device``, ``len()`` and
iteration then answer from it. Calls stay module-level: leaves are still ``call_module`` nodes
that every pass can fold.

The graph is then *specialized* to the example inputs' shapes: numbers computed from shapes are
constants in it. So the captured graph starts with a guard (``torch._assert``) that each
specialized input has the example's shape, and the report lists what was specialized: called
with another shape, the optimized module raises instead of computing something else.

What fake tensors cannot answer is a question about values (``if x.sum() > 0``): tracing still
fails there, and capture falls back (see ``fxmobile.capture.trace``).
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.node import map_aggregate

_UNKNOWN = object()  # a proxy whose fake value could not be computed


class ShapedProxy(fx.Proxy):
    """A proxy that knows its value's shape, dtype and device (``meta``, a fake tensor or a
    structure of them), where that could be computed."""

    meta: Any = _UNKNOWN

    def _tensor(self) -> torch.Tensor | None:
        meta = self.meta
        return meta if isinstance(meta, torch.Tensor) else None

    def _answer(self, what: str) -> Any:
        tensor = self._tensor()
        if tensor is None:
            return None
        tracer = self.tracer
        assert isinstance(tracer, ShapeTracer)
        tracer.specialized.add(f"{self.node.name}.{what}")
        return tensor

    def size(self, dim: int | None = None) -> Any:
        tensor = self._answer("size()")
        if tensor is None:
            return self.tracer.create_proxy("call_method", "size", (self, *_opt(dim)), {})
        return tensor.size() if dim is None else tensor.size(dim)

    def dim(self) -> Any:
        tensor = self._answer("dim()")
        if tensor is None:
            return self.tracer.create_proxy("call_method", "dim", (self,), {})
        return tensor.dim()

    def numel(self) -> Any:
        tensor = self._answer("numel()")
        if tensor is None:
            return self.tracer.create_proxy("call_method", "numel", (self,), {})
        return tensor.numel()

    @property
    def shape(self) -> Any:
        tensor = self._answer("shape")
        return self._attribute("shape") if tensor is None else tensor.shape

    @property
    def ndim(self) -> Any:
        tensor = self._answer("ndim")
        return self._attribute("ndim") if tensor is None else tensor.ndim

    @property
    def dtype(self) -> Any:
        tensor = self._tensor()
        return self._attribute("dtype") if tensor is None else tensor.dtype

    @property
    def device(self) -> Any:
        # Fake tensors keep the device of what they stand for.
        tensor = self._tensor()
        return self._attribute("device") if tensor is None else tensor.device

    def _attribute(self, name: str) -> Any:
        return fx.proxy.Attribute(self, name)

    def __len__(self) -> int:
        meta = self.meta
        if isinstance(meta, torch.Tensor):
            self._answer("len()")
            return len(meta)
        if isinstance(meta, tuple | list):
            return len(meta)
        return super().__len__()

    def __iter__(self) -> Iterator[Any]:
        meta = self.meta
        if isinstance(meta, tuple | list):
            return iter([operator.getitem(self, i) for i in range(len(meta))])
        if isinstance(meta, torch.Tensor) and meta.dim() > 0:
            self._answer("iteration")
            return iter([operator.getitem(self, i) for i in range(meta.shape[0])])
        return super().__iter__()


def _opt(dim: int | None) -> tuple[int, ...]:
    return () if dim is None else (dim,)


class ShapeTracer:
    """What a tracer needs to become shape-aware: mix it into an ``fx.Tracer`` subclass and
    call ``start`` with the example inputs by parameter name before tracing."""

    root: nn.Module  # set by fx.Tracer.trace
    computing: bool = False  # a fake value is being computed: record nothing
    fake_mode: FakeTensorMode
    placeholder_metas: dict[str, Any]
    specialized: set[str]

    def start(self, inputs: dict[str, Any]) -> None:
        """Fake versions of the example inputs, keyed by forward's parameter names."""
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.specialized = set()
        self.placeholder_metas = {
            name: map_aggregate(value, self._fake) for name, value in inputs.items()
        }

    def _fake(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self.fake_mode.from_tensor(value)
        return value

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return ShapedProxy(node, self)  # type: ignore[arg-type]

    def attach_meta(
        self, proxy: Any, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Run the op the node records on fake tensors and attach the result to ``proxy``."""
        if not isinstance(proxy, ShapedProxy):
            return
        self.computing = True
        try:
            proxy.meta = self._meta(kind, target, args, kwargs)
        except Exception:
            proxy.meta = _UNKNOWN
        finally:
            self.computing = False

    def _meta(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if kind == "placeholder":
            return self.placeholder_metas.get(str(target), _UNKNOWN)
        if kind == "get_attr":
            value = self._get_attr(str(target))
            return self._fake(value) if isinstance(value, torch.Tensor) else value
        metas = map_aggregate((args, kwargs), _meta_of)
        if _has_unknown(metas):
            return _UNKNOWN
        fake_args, fake_kwargs = metas
        with self.fake_mode, torch.no_grad():
            if kind == "call_function":
                return target(*fake_args, **fake_kwargs)
            if kind == "call_method":
                receiver, *rest = fake_args
                return getattr(receiver, target)(*rest, **fake_kwargs)
            if kind == "call_module":
                module = self._get_attr(str(target))
                assert isinstance(module, nn.Module)
                # forward itself: a module kept with its hooks must not run them on fakes
                return type(module).forward(module, *fake_args, **fake_kwargs)
        return _UNKNOWN

    def _get_attr(self, qualname: str) -> Any:
        root: Any = self.root
        for part in qualname.split("."):
            root = getattr(root, part)
        return root


def _meta_of(value: Any) -> Any:
    return value.meta if isinstance(value, ShapedProxy) else value


def _has_unknown(value: Any) -> bool:
    found = False

    def check(v: Any) -> Any:
        nonlocal found
        found = found or v is _UNKNOWN or isinstance(v, fx.Proxy)
        return v

    map_aggregate(value, check)
    return found


def parameter_inputs(
    forward: Any, inputs: tuple[Any, ...]
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """How the example inputs bind to ``forward``'s parameters: the traced inputs by name, the
    concrete values for every other parameter (its default), and notes on what was fixed.

    ``*args`` takes the inputs left after the named parameters, each as an input of its own
    (``args_0``, ``args_1``...); ``**kwargs`` is fixed to ``{}``; a parameter without an input
    keeps its default (a ``None`` default that forward tests is then a constant, not an input).
    """
    signature = inspect.signature(forward)
    traced: dict[str, Any] = {}
    concrete: dict[str, Any] = {}
    notes: list[str] = []
    rest = list(inputs)
    for param in signature.parameters.values():
        if param.kind is param.VAR_POSITIONAL:
            for i, value in enumerate(rest):
                traced[f"{param.name}_{i}"] = value
            if rest:
                notes.append(f"*{param.name} taken as {len(rest)} positional input(s)")
            rest = []
        elif param.kind is param.VAR_KEYWORD:
            notes.append(f"**{param.name} fixed to {{}}")
        elif rest and param.kind is not param.KEYWORD_ONLY:
            traced[param.name] = rest.pop(0)
        elif param.default is not param.empty:
            concrete[param.name] = param.default
            notes.append(f"{param.name} fixed to its default {param.default!r}")
    return traced, concrete, notes


class RootForward:
    """While active, ``model``'s class is a subclass whose ``forward`` takes exactly the traced
    inputs as named parameters, passes the other parameters their fixed values, and runs the
    model's own hooks when ``hooks`` is set; torch.fx, which traces ``type(root).forward`` and
    names placeholders after its parameters, then traces that.

    ``traced`` are the traced parameter names in call order (``x``, ``args_0``...), the first
    ``positional`` of them passed positionally and the rest as ``*args``; ``fixed`` are passed
    by keyword.
    """

    def __init__(
        self,
        model: nn.Module,
        traced: list[str],
        fixed: dict[str, Any],
        hooks: bool,
    ) -> None:
        self.model = model
        self.cls = type(model)
        self.traced = traced
        self.fixed = fixed
        self.hooks = hooks

    def __enter__(self) -> None:
        from fxmobile.capture.hooks import run_forward_hooks, run_pre_hooks

        original = self.cls.forward
        fixed, hooks = dict(self.fixed), self.hooks

        def call(module: nn.Module, args: tuple[Any, ...]) -> Any:
            kwargs = dict(fixed)
            if hooks:
                args, kwargs = run_pre_hooks(module, args, kwargs)
            out = original(module, *args, **kwargs)
            return run_forward_hooks(module, args, kwargs, out) if hooks else out

        names = ", ".join(self.traced)
        source = (
            f"def forward(self, {names}):\n    return call(self, ({names}{',' if names else ''}))\n"
        )
        scope: dict[str, Any] = {"call": call}
        exec(compile(source, f"<fxmobile forward of {self.cls.__name__}>", "exec"), scope)
        forward = scope["forward"]
        self.model.__class__ = type(self.cls.__name__, (self.cls,), {"forward": forward})

    def __exit__(self, *exc: object) -> None:
        self.model.__class__ = self.cls
