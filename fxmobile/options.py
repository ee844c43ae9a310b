"""What a caller can ask for, validated once at the door into one ``Options`` object.

``MobileOptimizerType`` has every member of upstream's ``torch._C._MobileOptimizerType`` under
the same name, the member upstream's Python enum lacks (``CONV_1D_TO_2D``), and one member per
fxmobile pass that can be switched off. Upstream members are accepted wherever a blocklist is
taken and mapped by name. ``Backend`` selects the mobile runtime, ``Check`` what happens when the
optimized module's outputs differ from eager's.

The public entry points (``fxmobile.api``) turn their arguments into an ``Options`` with
``make_options``; the stages below trust it and never check an argument again.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from fxmobile.errors import InvalidArgumentError, InvalidValueError

# A tolerance is the max abs error of an output relative to the largest finite magnitude of
# eager's output. Without one from the caller, each output's dtype picks it, as torch.testing's
# defaults do (its rtol: float16 1e-3, bfloat16 1.6e-2, float32 1.3e-6, float64 1e-7; integers
# and bool exact).
DEFAULT_TOLERANCE = 1e-4  # float32's: a whole network's rounding, 77x torch.testing's rtol
TOLERANCES: dict[torch.dtype, float] = {
    torch.float32: DEFAULT_TOLERANCE,
    # torch.testing's float16 rtol is 770x its float32 one, and rounding alone bears that out:
    # 4e-4..1.3e-3 on the models measured (small CNN, MLP, resnet18, mobilenet_v3_small,
    # efficientnet_b0), against 1e-7..8e-7 in float32. 770 x 1e-4 (7.7e-2) would come close
    # to what real bugs give (the README's wrong fold: 9.5e-2), so float16 takes 10x its rtol,
    # 1e-2: 8x over the worst rounding measured.
    torch.float16: 1e-2,
    # bfloat16 keeps 8 mantissa bits to float16's 11 (torch.testing's rtol ratio between the
    # two is 16): rounding measured 3.8e-3..9.1e-3 (resnet50). 5e-2 is 5x over that and still
    # under the errors of a wrong fold (9.5e-2) or a training BatchNorm frozen (0.34).
    torch.bfloat16: 5e-2,
    # torch.testing's own float64 rtol. Its ratio to float32's (0.077) would give 7.7e-6, but
    # float64 rounding measures 1e-16..3e-15 here, so the tighter value costs nothing and also
    # stops a pass that computes a float64 model in float32 (errors near 1e-7 and above).
    torch.float64: 1e-7,
}
# Complex outputs take their parts' dtype's tolerance, as in torch.testing.
_PARTS = {torch.complex32: torch.float16, torch.complex64: torch.float32,
          torch.complex128: torch.float64}  # fmt: skip


def describe_tolerance(tolerance: float | None) -> str:
    """``tolerance`` as a person reads it: the number, or "by dtype" for None."""
    return "by each output's dtype" if tolerance is None else f"{tolerance:g}"


def tolerance_for(dtype: torch.dtype) -> float:
    """The default tolerance of an output of ``dtype``: the table above; 0 (exact) for integer
    and bool outputs (an index or a token id off by one is wrong, however large the scale)."""
    dtype = _PARTS.get(dtype, dtype)
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    if dtype.is_floating_point:  # float8 kinds: as coarse as bfloat16, at least
        return TOLERANCES[torch.bfloat16]
    return 0.0


class MobileOptimizerType(enum.Enum):
    """One member per optimization that a blocklist can switch off."""

    # upstream's members (torch._C._MobileOptimizerType), same names and meanings
    CONV_BN_FUSION = "conv_bn_fusion"
    INSERT_FOLD_PREPACK_OPS = "insert_fold_prepack_ops"
    REMOVE_DROPOUT = "remove_dropout"
    FUSE_ADD_RELU = "fuse_add_relu"
    HOIST_CONV_PACKED_PARAMS = "hoist_conv_packed_params"
    VULKAN_AUTOMATIC_GPU_TRANSFER = "vulkan_automatic_gpu_transfer"
    # in upstream's C++ enum, missing from its Python binding
    CONV_1D_TO_2D = "conv_1d_to_2d"
    # fxmobile's own passes (REMOVE_DROPOUT and CONV_BN_FUSION above also gate FX passes)
    REMOVE_IDENTITY = "remove_identity"
    FOLD_CONV_ARITHMETIC = "fold_conv_arithmetic"
    DECOMPOSE_BATCHNORM = "decompose_batchnorm"
    FOLD_CONSTANTS = "fold_constants"
    ELIMINATE_DEAD_CODE = "eliminate_dead_code"
    CHANNELS_LAST = "channels_last"
    INLINE_MODULES = "inline_modules"
    # the ExecuTorch target's passes on the exported graph (fxmobile.executorch.passes)
    DECOMPOSE_SDPA = "decompose_sdpa"
    DECOMPOSE_LAYER_NORM = "decompose_layer_norm"
    SLICE_SELECTIONS = "slice_selections"
    RESHAPE_VIEWS = "reshape_views"
    SCALARS_AS_CONSTANTS = "scalars_as_constants"
    REMOVE_EXPANDS = "remove_expands"
    MATMUL_AS_BMM = "matmul_as_bmm"
    DECOMPOSE_GROUP_NORM = "decompose_group_norm"
    UPSAMPLE_NEAREST_AS_CONV_TRANSPOSE = "upsample_nearest_as_conv_transpose"
    DECOMPOSE_VECTOR_NORM = "decompose_vector_norm"
    DECOMPOSE_VARIANCE = "decompose_variance"
    DECOMPOSE_MEAN = "decompose_mean"
    DECOMPOSE_TANH_GELU = "decompose_tanh_gelu"
    FOLD_CONSTANT_SUBGRAPHS = "fold_constant_subgraphs"
    ROLL_AS_SLICES = "roll_as_slices"
    PAD_AS_SLICES = "pad_as_slices"
    STRIDED_SLICES = "strided_slices"
    SOFTMAX_OVER_LAST_DIM = "softmax_over_last_dim"
    POW_AS_PRODUCTS = "pow_as_products"
    REMOVE_LAYOUT_COPIES = "remove_layout_copies"
    AVG_POOL_PADDING_AS_PAD = "avg_pool_padding_as_pad"
    POOL1D_AS_POOL2D = "pool1d_as_pool2d"
    UNFOLD_AS_PERMUTE = "unfold_as_permute"
    # (the export stage's decompose_batchnorm is DECOMPOSE_BATCHNORM: the same rewrite)


UNKNOWN_BACKEND = "Unknown backend, must be one of 'CPU', 'Vulkan' or 'Metal'"


class Backend(enum.Enum):
    """The mobile runtime to optimize for."""

    CPU = "cpu"
    VULKAN = "vulkan"
    METAL = "metal"

    @classmethod
    def parse(cls, value: Backend | str) -> Backend:
        """A member, or its name in any case (upstream's spelling); upstream's error otherwise."""
        if isinstance(value, Backend):
            return value
        if isinstance(value, str):
            for member in cls:
                if member.value == value.lower():
                    return member
        raise InvalidArgumentError(f"{UNKNOWN_BACKEND} (got {value!r})")


class Check(enum.StrEnum):
    """What to do when example inputs are given and an output differs beyond the tolerance."""

    RAISE = "raise"  # NumericalMismatchError, naming the output and the first diverging pass
    WARN = "warn"  # return the module with a warning; the report holds the failed check
    OFF = "off"  # do not run the model at all


BlocklistItem = MobileOptimizerType | torch._C._MobileOptimizerType
# A leaf module: a class, a submodule instance of the model, or a submodule's qualified name.
LeafSpec = type[nn.Module] | nn.Module | str


@dataclass(frozen=True)
class Options:
    """Every argument of the entry points, checked. The stages read it and check nothing."""

    blocklist: frozenset[MobileOptimizerType] = frozenset()
    backend: Backend | None = None  # None: the FX stage alone (optimize_fx)
    preserved_methods: tuple[str, ...] = ()
    example_inputs: tuple[Any, ...] | None = None
    leaf_modules: tuple[LeafSpec, ...] = ()
    concrete_args: Mapping[str, Any] | None = None
    auto_leaf: bool = True
    eval_copy: bool = False
    channels_last: bool = False
    tolerance: float | None = None  # None: by each output's dtype (tolerance_for)
    check: Check = Check.RAISE

    @property
    def checks(self) -> bool:
        """Whether the optimized module is run against eager (inputs given, check not off)."""
        return self.example_inputs is not None and self.check is not Check.OFF

    @property
    def specialized_args(self) -> dict[str, Any]:
        """The concrete arguments that are values (``fx.PH`` keeps a parameter an input)."""
        return {k: v for k, v in (self.concrete_args or {}).items() if v is not fx.PH}


def make_options(
    *,
    blocklist: Iterable[BlocklistItem] | None = None,
    backend: Backend | str | None = None,
    preserved_methods: Sequence[str] | None = None,
    example_inputs: Any = None,
    leaf_modules: Iterable[LeafSpec] = (),
    concrete_args: Mapping[str, Any] | None = None,
    auto_leaf: bool = True,
    eval_copy: bool = False,
    channels_last: bool | None = None,
    tolerance: float | None = None,
    check: Check | str = Check.RAISE,
) -> Options:
    """Check every argument and return them as one ``Options``.

    ``channels_last=None`` means: on for the CPU backend (its prepacked kernels read and write
    channels-last activations), off for Vulkan, Metal and the FX stage alone.
    """
    target = None if backend is None else Backend.parse(backend)
    if channels_last is None:
        channels_last = target is Backend.CPU
    return Options(
        blocklist=normalize_blocklist(blocklist),
        backend=target,
        preserved_methods=_preserved_names(preserved_methods),
        example_inputs=None if example_inputs is None else as_input_tuple(example_inputs),
        leaf_modules=_leaf_specs(leaf_modules),
        concrete_args=_concrete_args(concrete_args),
        auto_leaf=_flag("auto_leaf", auto_leaf),
        eval_copy=_flag("eval_copy", eval_copy),
        channels_last=_flag("channels_last", channels_last),
        tolerance=_tolerance(tolerance),
        check=_check(check),
    )


def normalize_blocklist(
    blocklist: Iterable[BlocklistItem] | None,
) -> frozenset[MobileOptimizerType]:
    """Turn a user's blocklist into a set of fxmobile members.

    Accepts fxmobile's members and upstream's ``torch._C._MobileOptimizerType`` members. Anything
    else (strings included: members are selected by object, never by name) is refused with the
    culprit and the valid members in the message.
    """
    if blocklist is None:
        return frozenset()
    if isinstance(blocklist, MobileOptimizerType | torch._C._MobileOptimizerType | str):
        raise InvalidArgumentError(
            f"blocklist must be a set or list of members, got the single value {blocklist!r}; "
            f"wrap it: {{{_spell(blocklist)}}}"
        )
    try:
        items = list(blocklist)
    except TypeError:
        raise InvalidArgumentError(
            f"blocklist must be an iterable of MobileOptimizerType members, "
            f"got {type(blocklist).__name__}"
        ) from None
    members = set()
    for item in items:
        if isinstance(item, MobileOptimizerType):
            members.add(item)
        elif isinstance(item, torch._C._MobileOptimizerType):
            members.add(MobileOptimizerType[item.name])  # type: ignore[attr-defined]
        else:
            valid = ", ".join(m.name for m in MobileOptimizerType)
            hint = (
                f" (use fxmobile.MobileOptimizerType.{item.upper()})"
                if isinstance(item, str) and item.upper() in MobileOptimizerType.__members__
                else ""
            )
            raise InvalidArgumentError(
                f"blocklist item {item!r} is not an optimization{hint}; expected a member of "
                f"fxmobile.MobileOptimizerType or torch._C._MobileOptimizerType: {valid}"
            )
    return frozenset(members)


def member_named(text: str) -> MobileOptimizerType:
    """A member from its name as a command line spells it: any case, ``-`` for ``_``.

    The one spelling the CLI and the zoo runner accept; raises ``KeyError`` naming the valid
    names otherwise.
    """
    key = text.strip().upper().replace("-", "_")
    if key in MobileOptimizerType.__members__:
        return MobileOptimizerType[key]
    valid = ", ".join(m.name.lower() for m in MobileOptimizerType)
    raise KeyError(f"{text!r} is not an optimization; valid names: {valid}")


def as_input_tuple(example_inputs: object) -> tuple[Any, ...]:
    """A single tensor becomes a 1-tuple; a tuple or list becomes a tuple.

    Tensors off the CPU are refused: the model is optimized and checked on the CPU.
    """
    from torch.utils import _pytree as pytree

    if isinstance(example_inputs, tuple):
        inputs = example_inputs
    elif isinstance(example_inputs, list):
        inputs = tuple(example_inputs)
    else:
        inputs = (example_inputs,)
    for path, leaf in pytree.tree_flatten_with_path(inputs)[0]:
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "cpu":
            raise InvalidValueError(
                f"example_inputs{pytree.keystr(path)} is on {leaf.device}; fxmobile optimizes "
                f"the model on the CPU and checks it there. Fix: pass CPU tensors (x.cpu())."
            )
    return inputs


def _tolerance(tolerance: object) -> float | None:
    """None (each output's dtype picks its tolerance), or a number (TypeError otherwise) that is
    finite-or-infinite, not NaN and not negative."""
    if tolerance is None:
        return None
    if isinstance(tolerance, bool) or not isinstance(tolerance, float | int):
        raise InvalidArgumentError(
            f"tolerance must be a non-negative number (relative error, e.g. 1e-4) or None (by "
            f"each output's dtype), got {type(tolerance).__name__} {tolerance!r}"
        )
    if math.isnan(tolerance) or tolerance < 0:
        raise InvalidValueError(
            f"tolerance must be a non-negative number (relative error, e.g. 1e-4), got "
            f"{tolerance!r}; pass tolerance=0 for exact equality"
        )
    return float(tolerance)


def _check(check: object) -> Check:
    if isinstance(check, Check):
        return check
    if isinstance(check, str) and check.lower() in Check._value2member_map_:
        return Check(check.lower())
    raise InvalidArgumentError(
        f"check must be one of 'raise', 'warn' or 'off' (or fxmobile.Check), got {check!r}"
    )


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")
    return value


def _preserved_names(preserved_methods: Sequence[str] | None) -> tuple[str, ...]:
    if preserved_methods is None:
        return ()
    if isinstance(preserved_methods, str | bytes):
        raise InvalidArgumentError(
            f"preserved_methods must be a list of method names, got the single name "
            f"{preserved_methods!r}; wrap it: [{preserved_methods!r}]"
        )
    # upstream converts byte strings too
    return tuple(m.decode() if isinstance(m, bytes) else str(m) for m in preserved_methods)


def _leaf_specs(leaf_modules: Iterable[LeafSpec]) -> tuple[LeafSpec, ...]:
    """The items' kinds only: which submodules they name is checked against the model."""
    if isinstance(leaf_modules, str | type | nn.Module):
        shown = leaf_modules.__name__ if isinstance(leaf_modules, type) else repr(leaf_modules)
        if isinstance(leaf_modules, nn.Module):
            shown = "m"  # the submodule the caller holds
        raise InvalidArgumentError(
            f"leaf_modules must be a list of module classes, submodules or qualified names, "
            f"got the single value {shown}; wrap it: leaf_modules=[{shown}]"
        )
    try:
        specs = tuple(leaf_modules)
    except TypeError:
        raise InvalidArgumentError(
            f"leaf_modules must be a list of module classes, submodules or qualified names, "
            f"got {type(leaf_modules).__name__}"
        ) from None
    for spec in specs:
        if not (isinstance(spec, str | nn.Module) or _is_module_class(spec)):
            raise InvalidArgumentError(
                f"leaf_modules items must be nn.Module classes, submodules or qualified names, "
                f"got {spec!r}"
            )
    return specs


def _is_module_class(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, nn.Module)


def _concrete_args(concrete_args: object) -> Mapping[str, Any] | None:
    if concrete_args is None:
        return None
    if not isinstance(concrete_args, Mapping):
        raise InvalidArgumentError(
            f"concrete_args must be a dict from forward's parameter names to values, got "
            f"{type(concrete_args).__name__}; e.g. concrete_args={{'flag': True}}"
        )
    return dict(concrete_args)


def _spell(value: object) -> str:
    if isinstance(value, MobileOptimizerType | torch._C._MobileOptimizerType):
        return f"MobileOptimizerType.{value.name}"  # type: ignore[union-attr]
    return repr(value)
