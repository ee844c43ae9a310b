"""The members that select optimizations, and blocklist normalization.

``MobileOptimizerType`` has every member of upstream's ``torch._C._MobileOptimizerType`` under
the same name, the member upstream's Python enum lacks (``CONV_1D_TO_2D``), and one member per
fxmobile FX pass. Upstream members are accepted wherever a blocklist is taken and mapped by name.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import torch

from fxmobile.errors import InvalidArgumentError


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
    # fxmobile's FX passes (REMOVE_DROPOUT and CONV_BN_FUSION above also gate FX passes)
    REMOVE_IDENTITY = "remove_identity"
    FOLD_CONV_ARITHMETIC = "fold_conv_arithmetic"
    DECOMPOSE_BATCHNORM = "decompose_batchnorm"
    FOLD_CONSTANTS = "fold_constants"
    ELIMINATE_DEAD_CODE = "eliminate_dead_code"
    CHANNELS_LAST = "channels_last"


BlocklistItem = MobileOptimizerType | torch._C._MobileOptimizerType


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


def _spell(value: object) -> str:
    if isinstance(value, MobileOptimizerType | torch._C._MobileOptimizerType):
        return f"MobileOptimizerType.{value.name}"  # type: ignore[union-attr]
    return repr(value)
