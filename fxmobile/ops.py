"""What ops do, in one place: which return views, which write in place, which are random, which
seed a generator.

Capture, every FX pass and the TorchScript checks ask here; no other module keeps a table of
view or in-place ops. Where torch knows the fact it is read from torch's own op schemas:

- a **view** returns memory aliasing an input: some overload's return carries an alias set and
  no argument is written (``view(Tensor(a) self, ...) -> Tensor(a)``, ``chunk(...) ->
  Tensor(a)[]``, ``contiguous``, ``reshape``: "may alias" counts);
- an **in-place** op writes an argument (``add_(Tensor(a!) self, ...)``), not counting the
  ``out=`` overloads, which write only when a call passes ``out``;
- a **random** op is tagged ``nondeterministic_seeded`` (``rand``, ``bernoulli``, ``dropout``);
- a **seeding** op sets a generator's state: an overload writes a ``Generator`` argument
  (``manual_seed.generator(Generator(a!) self, int seed)``, ``seed(Generator(a!) self)``; the
  ``int`` overload of ``manual_seed`` seeds the default generator, which its schema leaves out).

So an op torch adds is classified without a hand-written entry. A Python-level call (an FX
node) is mapped to its aten op by name: a tensor method or a function of torch's namespaces
(``torch.chunk``, ``Tensor.chunk``, ``F.relu``) names the op, ``operator`` functions name the
op Python dispatches to (``operator.getitem`` on a tensor is indexing: a view), and
``inplace=True`` / ``out=`` arguments write. What torch cannot say is written here, with the
reason: attributes that are views (``x.T``), modules whose output is their input or a view of it,
ops that need uninitialized memory, the reshapes whose result is a view only for some
memory layouts, and ``set_rng_state``, which sets the generator in Python, without an op.

A torch function that is no aten op (``F.interpolate``, composed in Python) may alias its
input but writes only when its name or an ``inplace`` / ``out`` argument says so. Anything else
(a user function kept opaque by ``torch.fx.wrap``, a module from outside ``torch.nn``, a module
that runs hooks) is ``UNKNOWN``: it may alias, write and draw random numbers.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

# operator functions -> the aten op Python's tensor protocol dispatches to
_OPERATORS: dict[Any, str] = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "div",
    operator.floordiv: "floor_divide",
    operator.mod: "remainder",
    operator.pow: "pow",
    operator.matmul: "matmul",
    operator.neg: "neg",
    operator.pos: "positive",
    operator.abs: "abs",
    operator.invert: "bitwise_not",
    operator.and_: "bitwise_and",
    operator.or_: "bitwise_or",
    operator.xor: "bitwise_xor",
    operator.lshift: "bitwise_left_shift",
    operator.rshift: "bitwise_right_shift",
    operator.eq: "eq",
    operator.ne: "ne",
    operator.lt: "lt",
    operator.le: "le",
    operator.gt: "gt",
    operator.ge: "ge",
    # basic indexing returns a view (advanced indexing copies: "may alias" is the safe answer)
    operator.getitem: "alias",
    # x[i] = v and the augmented assignments write their first operand
    operator.setitem: "index_put_",
    operator.iadd: "add_",
    operator.isub: "sub_",
    operator.imul: "mul_",
    operator.itruediv: "div_",
    operator.ifloordiv: "floor_divide_",
    operator.imod: "remainder_",
    operator.ipow: "pow_",
    operator.imatmul: "matmul",  # x @= y is not in place for tensors
    operator.iand: "bitwise_and_",
    operator.ior: "bitwise_or_",
    operator.ixor: "bitwise_xor_",
    operator.ilshift: "bitwise_left_shift_",
    operator.irshift: "bitwise_right_shift_",
}

# Ops whose schema calls their result fresh although they return their input itself when
# there is nothing to convert (``x.type_as(x) is x``).
RETURNS_INPUT = frozenset({"type_as"})

# Tensor attributes that are views (``x.T`` is ``numpy_T``); ``data`` shares x's memory.
VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})

# Ops that return uninitialized memory: their result is no value (torch tags none of them).
UNINITIALIZED = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
)

# Views whose result is a view only when the input's strides allow it, a copy otherwise: a
# write through them reaches the input in eager's layout and not once the input is
# channels-last (the schemas call all of them "may alias").
LAYOUT_DEPENDENT_VIEWS = frozenset(
    {"reshape", "reshape_as", "flatten", "view", "view_as", "contiguous", "unflatten"}
)

# Views that raise instead of copying when the strides do not allow them (``y.view(n, -1)`` on
# a channels-last ``y``; ``view_as_complex`` wants the last dimension's stride to be 1); every
# other ATen op takes any strides.
STRIDE_STRICT_VIEWS = frozenset({"view", "view_as", "_unsafe_view", "view_as_complex"})

# Functions of torch's namespace that set the global generator's state with no op of their own
# (``torch.set_rng_state`` is Python: ``default_generator.set_state``), besides the seeding ops.
SETS_RNG_STATE = frozenset({"set_rng_state"})

# Calls that read an input's memory layout itself rather than its values.
STRIDE_READERS = frozenset(
    {"as_strided", "stride", "data_ptr", "storage_offset", "untyped_storage", "is_contiguous",
     "numpy"}
)  # fmt: skip

# Modules whose output can be their input or a view of it: a write to the output reaches the
# input (nn.Flatten is torch.flatten, a view of contiguous input; eval-mode dropout and
# Identity return the input itself).
ALIASING_MODULES: tuple[type[nn.Module], ...] = (
    nn.Flatten,
    nn.Unflatten,
    nn.Identity,
    nn.modules.dropout._DropoutNd,
)

# Functions that update running statistics in place when this flag is not False:
# (position of the flag, its keyword, its default).
STATS_FUNCTIONS: dict[Any, tuple[int, str, bool]] = {
    torch.nn.functional.batch_norm: (5, "training", False),
    torch.nn.functional.instance_norm: (5, "use_input_stats", True),
    torch.batch_norm: (5, "training", False),
    torch.instance_norm: (5, "use_input_stats", True),
}


@dataclass(frozen=True)
class OpInfo:
    """What one op does to its inputs (conservative where torch has no schema for it)."""

    name: str | None
    view: bool  # its result may share memory with an input
    writes: bool  # it writes an input, or state, in place
    random: bool  # it draws from the random number generator
    seeds: bool = False  # it sets a random number generator's state (``manual_seed``)

    @property
    def pure(self) -> bool:
        """Writes nothing, draws nothing, seeds nothing: removable when its result is unused."""
        return not self.writes and not self.random and not self.seeds


UNKNOWN = OpInfo(None, view=True, writes=True, random=True, seeds=True)
NOTHING = OpInfo(None, view=False, writes=False, random=False)


@functools.cache
def is_aten(name: str) -> bool:
    """Whether torch has an ``aten::<name>`` op (with a schema), not a Python composition."""
    return bool(torch._C._jit_get_schemas_for_operator(f"aten::{name}"))


@functools.cache
def aten(name: str) -> OpInfo:
    """What ``aten::<name>`` does, from its overloads' schemas and tags.

    A name torch has no op for (a torch function composed in Python) may alias its input and
    writes only when it ends in ``_``.
    """
    if not is_aten(name):
        return OpInfo(name, view=True, writes=_writes_by_name(name), random=False)
    schemas = torch._C._jit_get_schemas_for_operator(f"aten::{name}")
    writes = view = False
    for schema in schemas:
        if _is_out_overload(schema):
            continue
        written = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        writes |= written
        view |= not written and any(r.alias_info is not None for r in schema.returns)
    return OpInfo(name, view or name in RETURNS_INPUT, writes, _random(name), _seeds(name))


# Tensor's in-place dunders (``x += y`` calls ``__iadd__``) and ``x[i] = v``.
_WRITING_DUNDERS = frozenset(
    {f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and",
                              "or", "xor", "lshift", "rshift")} | {"__setitem__"}
)  # fmt: skip


def _writes_by_name(name: str) -> bool:
    """torch's naming rule for what has no schema: ``relu_`` writes, ``__getitem__`` does not."""
    if name.startswith("__"):
        return name in _WRITING_DUNDERS
    return name.endswith("_")


def _is_out_overload(schema: Any) -> bool:
    """An ``out=`` overload writes only when a call passes ``out``."""
    return any(a.name == "out" and a.alias_info is not None for a in schema.arguments)


def _random(name: str) -> bool:
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return False
    for overload in packet.overloads():
        if torch.Tag.nondeterministic_seeded in getattr(packet, overload).tags:
            return True
    return False


@functools.cache
def _seeds(name: str) -> bool:
    """Whether an overload of ``aten::<name>`` writes a ``Generator`` argument."""
    return any(
        a.alias_info is not None and a.alias_info.is_write and a.type.kind() == "GeneratorType"
        for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}")
        for a in schema.arguments
    )


@functools.cache
def random_functions() -> tuple[str, ...]:
    """The public functions of ``torch``'s namespace whose op draws random numbers
    (``torch.randn``, ``torch.randint``, ``torch.normal``, ``torch.bernoulli``...)."""
    return tuple(n for n in _torch_functions() if is_aten(n) and aten(n).random)


@functools.cache
def rng_state_functions() -> tuple[str, ...]:
    """The public functions of ``torch``'s namespace that seed or set the global generator
    (``torch.manual_seed``, ``torch.seed``, ``torch.set_rng_state``)."""
    return tuple(n for n in _torch_functions() if n in SETS_RNG_STATE or (is_aten(n) and _seeds(n)))


def _torch_functions() -> list[str]:
    return [n for n in dir(torch) if not n.startswith("_") and callable(getattr(torch, n, None))]


def call_name(node: fx.Node) -> str | None:
    """The aten op a ``call_method`` / ``call_function`` node runs, by name, or None when it
    is no torch op (a user function, ``getattr`` of a non-view attribute, ``len``...)."""
    if node.op == "call_method":
        return str(node.target)
    if node.op != "call_function":
        return None
    target = node.target
    if target in _OPERATORS:
        return _OPERATORS[target]
    if target is getattr:
        attribute = node.args[1] if len(node.args) > 1 else None
        return "alias" if attribute in VIEW_ATTRIBUTES else None
    if _from_torch(target):
        return getattr(target, "__name__", None)
    return None


def _from_torch(target: Any) -> bool:
    if getattr(target, "__objclass__", None) in (torch.Tensor, torch._C.TensorBase):
        return True
    module = getattr(target, "__module__", None) or ""
    if not module and hasattr(target, "__self__"):  # a builtin method, e.g. torch._C._nn.*
        module = type(target.__self__).__module__ or ""
    return module == "torch" or module.startswith("torch.")


def fx_op(gm: fx.GraphModule, node: fx.Node) -> OpInfo:
    """What ``node`` does to its inputs. Placeholders, outputs and ``get_attr`` touch nothing;
    a module call is ``module_op``; a call of no torch op is ``UNKNOWN`` unless it is Python's
    own arithmetic on non-tensors (fx records ``x.shape[0]`` as ``getitem(getattr(x, "shape"),
    0)``)."""
    if node.op in ("placeholder", "output", "get_attr"):
        return NOTHING
    if node.op == "call_module":
        return module_op(gm.get_submodule(str(node.target)))
    return call_op(node)


def call_op(node: fx.Node) -> OpInfo:
    """``fx_op`` of a ``call_method`` or ``call_function`` node (no module to look up)."""
    name = call_name(node)
    if name is None:
        return NOTHING if node.op == "call_function" and _plain_python(node.target) else UNKNOWN
    info = aten(name)
    if node.kwargs.get("inplace") is True or _out_nodes(node):
        info = OpInfo(name, info.view, True, info.random, info.seeds)
    return info


def takes_any_layout(node: fx.Node) -> bool:
    """Whether a ``call_method`` / ``call_function`` node runs on inputs of any strides: an ATen
    op other than ``STRIDE_STRICT_VIEWS`` and ``STRIDE_READERS`` (ATen's kernels take any
    strides), or Python's own arithmetic on non-tensors. A user function, or a torch function
    composed in Python (``F.interpolate``), is not known to."""
    name = call_name(node)
    if name is None:
        return node.op == "call_function" and _plain_python(node.target)
    return is_aten(name) and name not in STRIDE_STRICT_VIEWS and name not in STRIDE_READERS


def _plain_python(target: Any) -> bool:
    """``getattr`` of a plain attribute, ``len``, and ``math`` / ``operator`` functions (fx
    records ``x.shape[0]`` as ``getitem(getattr(x, "shape"), 0)`` and wraps ``math``): they
    compute Python values and touch no tensor."""
    return target in (getattr, len) or getattr(target, "__module__", None) in ("math", "_operator")


def module_op(module: nn.Module) -> OpInfo:
    """What calling ``module`` does: a ``torch.nn`` module without hooks writes only when it
    is in place, aliases when ``ALIASING_MODULES`` says so and draws random numbers when it is
    a dropout in training mode; any other module is ``UNKNOWN``."""
    if not type(module).__module__.startswith("torch.nn.") or has_hooks(module):
        return UNKNOWN
    view = isinstance(module, ALIASING_MODULES)
    random = isinstance(module, nn.modules.dropout._DropoutNd) and module.training
    return OpInfo(type(module).__name__, view, bool(getattr(module, "inplace", False)), random)


def has_hooks(module: nn.Module) -> bool:
    """Whether calling ``module`` runs more than its ``forward``: forward hooks or pre-hooks of
    its own, or torch's global module hooks."""
    from torch.nn.modules import module as module_mod

    own = module._forward_hooks or module._forward_pre_hooks
    return bool(own or module_mod._global_forward_hooks or module_mod._global_forward_pre_hooks)


def _out_nodes(node: fx.Node) -> list[fx.Node]:
    """The nodes given as ``out=``: one, or a tuple of them (``native_batch_norm``'s three)."""
    out = node.kwargs.get("out")
    outs = out if isinstance(out, tuple | list) else (out,)
    return [o for o in outs if isinstance(o, fx.Node)]


def written_inputs(node: fx.Node) -> list[fx.Node]:
    """The inputs an in-place node writes: those given as ``out=``, else its first tensor
    argument."""
    outs = _out_nodes(node)
    if outs:
        return outs
    first = node.args[0] if node.args else None
    return [first] if isinstance(first, fx.Node) else []


@functools.cache
def _script_schema(schema: str) -> Any:
    if schema == "(no schema)":
        return None
    try:
        return torch._C.parse_schema(schema)
    except RuntimeError:
        return None


# TorchScript nodes without a schema that hand out an element of a list or tuple: the element
# is the same tensor the container holds.
_SCRIPT_UNPACKS = frozenset({"prim::ListUnpack", "prim::TupleUnpack", "prim::TupleIndex"})


def script_op(node: torch._C.Node) -> OpInfo:
    """What a TorchScript node does, from its own schema (containers' unpacking included): any
    registered op's, the prepacked run ops' too (``run(Tensor X, ...) -> Tensor Y``: a fresh
    result, nothing written), since torch holds every op to its schema; UNKNOWN (may alias, may
    write) for an op without one."""
    kind = node.kind()
    if kind in _SCRIPT_UNPACKS:
        return OpInfo(kind, view=True, writes=False, random=False)
    try:
        schema = _script_schema(node.schema())
    except RuntimeError:  # an op torch knows no schema for
        schema = None
    if schema is None:
        return NOTHING if kind.startswith("prim::") else UNKNOWN
    written = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    view = not written and any(r.alias_info is not None for r in schema.returns)
    aten_name = kind.split("::", 1)[1] if kind.startswith("aten::") else None
    random = aten_name is not None and _random(aten_name)
    return OpInfo(kind, view, written, random, aten_name is not None and _seeds(aten_name))
