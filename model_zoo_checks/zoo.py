"""The model catalogue: which torchvision models exist, how to build them and what to feed them.

Models are built with random weights (nothing is downloaded) and their BatchNorm statistics are
randomized by a few training-mode forwards before ``.eval()``: with the default statistics
(mean 0, var 1) a folding bug stays invisible.

Five torchvision kinds: every classification model, the segmentation and video models, the
quantizable classification models after post-training quantization, and the detection models;
and two kinds nobody here wrote: timm's models (``timm_models``) and models from the ecosystems
users bring, ultralytics, transformers and segmentation_models_pytorch (``ecosystem``). Each entry
says which route it takes through fxmobile (``Route``) and, when fxmobile cannot take it at all,
why (``unsupported``); ``python -m model_zoo_checks --list`` prints the catalogue.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import torch
from torch import nn

from fxmobile.verify import randomize_batchnorm_statistics

# Models whose optimization needs most of this machine's memory: run one per process, guarded.
GIANTS = frozenset({"vit_h_14", "regnet_y_128gf"})

# Families whose every BatchNorm must fold away in the FX stage.
BN_FREE_FAMILIES = ("resnet", "mobilenet", "mnasnet", "shufflenet", "regnet", "efficientnet")

DEFAULT_TOLERANCE = 1e-4  # max abs error relative to max |eager output|, float models
# A quantized model's optimized graph runs the same quantized kernels as eager; a difference
# there is at most a rounding step of the output's scale, which 1e-2 of it bounds.
QUANTIZED_TOLERANCE = 1e-2


class Kind(enum.StrEnum):
    """Which part of the catalogue a model comes from, and so how it is built and fed."""

    CLASSIFICATION = "classification"
    SEGMENTATION = "segmentation"
    VIDEO = "video"
    QUANTIZED = "quantized"
    DETECTION = "detection"
    TIMM = "timm"  # model_zoo_checks.timm_models
    ECOSYSTEM = "ecosystem"  # model_zoo_checks.ecosystem: ultralytics, transformers, smp


# Kinds a run takes only when selected (--kind, or a model by name): they are the target of
# issue 12, not yet a baseline, and would add hours to `make zoo`.
OPT_IN_KINDS = frozenset({Kind.TIMM, Kind.ECOSYSTEM})


class Route(enum.StrEnum):
    """How a model enters fxmobile."""

    FX = "fx"  # the eager model: FX stage, then TorchScript stage
    SCRIPT = "script"  # torch.jit.script(model): the TorchScript stage only


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One catalogue entry: a model to build with random weights and the input to check it on.

    ``key`` identifies it (resized copies included); ``build_randomized`` and ``example_inputs``
    give the model and inputs a check uses, both seeded.
    """

    name: str  # torchvision's builder name (detection cores: the detector's name + "_core")
    kind: Kind
    input_shape: tuple[int, ...]
    family: str = ""  # derived from the name when empty
    route: Route = Route.FX
    unsupported: str | None = None  # why fxmobile cannot take this model; not run by default
    variant: str = ""  # set on resized copies (the quick subset), part of the key

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind(self.kind))
        object.__setattr__(self, "route", Route(self.route))
        if not self.family:
            object.__setattr__(self, "family", _family(self.name))

    @property
    def key(self) -> str:
        """Unique per name and input: ``resnet18``, or ``resnet18@64x64`` for a resized copy."""
        return f"{self.name}@{self.variant}" if self.variant else self.name

    @property
    def tolerance(self) -> float:
        return QUANTIZED_TOLERANCE if self.kind is Kind.QUANTIZED else DEFAULT_TOLERANCE

    @property
    def giant(self) -> bool:
        return self.name in GIANTS

    def resized(self, input_shape: tuple[int, ...]) -> ZooModel:
        variant = "x".join(str(d) for d in input_shape[2:])
        return dataclasses.replace(self, input_shape=input_shape, variant=variant)

    def build(self) -> nn.Module:
        """The bare model: random weights, default BatchNorm statistics, training mode."""
        from model_zoo_checks import builders

        return builders.build(self)

    def build_randomized(self, seed: int = 0) -> nn.Module:
        """The model to check: random weights, randomized statistics, eval mode (quantized
        models: randomized, then fused, calibrated and converted)."""
        from model_zoo_checks import builders

        torch.manual_seed(seed)
        if self.kind is Kind.QUANTIZED:
            return builders.build_quantized(self, seed)
        if self.kind is Kind.DETECTION:
            return builders.build_detection(self, seed)
        if self.kind is Kind.TIMM:
            from model_zoo_checks.timm_models import build_randomized

            return build_randomized(self, seed)
        return randomize_batchnorm_statistics(self.build(), self.input_shape, seed)

    def example_inputs(self, seed: int = 0) -> tuple[Any, ...]:
        """The positional inputs of one forward: a batch, or a detector's list of images."""
        gen = torch.Generator().manual_seed(seed)
        if self.kind is Kind.DETECTION and self.route is Route.SCRIPT:
            return ([torch.rand(self.input_shape[1:], generator=gen)],)
        return (torch.randn(self.input_shape, generator=gen),)


def _family(name: str) -> str:
    name = name.removeprefix("quantized_")
    for family in (*BN_FREE_FAMILIES, "resnext", "wide_resnet", "convnext", "densenet", "vgg"):
        if name.startswith(family):
            return family
    return name.rstrip("0123456789_").split("_")[0]


_INPUT = {"inception_v3": (1, 3, 299, 299)}


def classification_models() -> list[ZooModel]:
    """Every classification builder torchvision lists, at 1x3x224x224 (inception_v3: 299)."""
    import torchvision

    names = torchvision.models.list_models(module=torchvision.models)
    return [ZooModel(n, Kind.CLASSIFICATION, _INPUT.get(n, (1, 3, 224, 224))) for n in names]


def segmentation_models() -> list[ZooModel]:
    """Every torchvision segmentation model, at 1x3x224x224, on the FX route."""
    import torchvision

    names = torchvision.models.list_models(module=torchvision.models.segmentation)
    # dict outputs and input-sized upsampling trace fine with torch.fx: the eager route
    return [ZooModel(n, Kind.SEGMENTATION, (1, 3, 224, 224)) for n in names]


# Video input: 8 frames of 112x112 unless a model needs more. s3d ends in a (2, 7, 7) average
# pool over a /8 time and /32 space reduction; the MViTs have fixed positional embeddings.
_VIDEO_INPUT = {
    "s3d": (1, 3, 16, 224, 224),
    "mvit_v1_b": (1, 3, 16, 224, 224),
    "mvit_v2_s": (1, 3, 16, 224, 224),
}
# torchvision wraps the Swin3D window-size helper with torch.fx.wrap; the helper writes to its
# list argument, which fx's Interpreter (fxmobile's shape propagation) hands over immutable.
_VIDEO_SCRIPTED = frozenset({"swin3d_t", "swin3d_s", "swin3d_b"})


def video_models() -> list[ZooModel]:
    """Every torchvision video model, at 8 frames of 112x112 unless it needs more; the Swin3D
    models take the script route (see ``_VIDEO_SCRIPTED``)."""
    import torchvision

    names = torchvision.models.list_models(module=torchvision.models.video)
    return [
        ZooModel(
            n,
            Kind.VIDEO,
            _VIDEO_INPUT.get(n, (1, 3, 8, 112, 112)),
            family=n.split("_")[0],
            route=Route.SCRIPT if n in _VIDEO_SCRIPTED else Route.FX,
        )
        for n in names
    ]


def quantized_models() -> list[ZooModel]:
    """torchvision.models.quantization after post-training quantization (see builders)."""
    import torchvision

    names = torchvision.models.list_models(module=torchvision.models.quantization)
    return [
        ZooModel(n, Kind.QUANTIZED, _INPUT.get(n.removeprefix("quantized_"), (1, 3, 224, 224)))
        for n in names
    ]


def detection_models() -> list[ZooModel]:
    """Each detector whole (scripted, and why it cannot go through), and its traceable core."""
    import torchvision

    from model_zoo_checks.builders import detection_input, detection_unsupported

    entries = []
    for n in torchvision.models.list_models(module=torchvision.models.detection):
        shape, family = detection_input(n), n.split("_")[0].rstrip("0123456789")
        entries.append(
            ZooModel(n, Kind.DETECTION, shape, family, Route.SCRIPT, detection_unsupported(n))
        )
        entries.append(ZooModel(f"{n}_core", Kind.DETECTION, shape, family))
    return entries


def all_models() -> list[ZooModel]:
    """The whole catalogue, every kind, in the order a run goes through it. Listing the timm
    entries imports timm (their input sizes come from its configs); the ecosystems are not
    imported."""
    from model_zoo_checks.ecosystem import ecosystem_models
    from model_zoo_checks.timm_models import timm_models

    return [
        *classification_models(),
        *segmentation_models(),
        *video_models(),
        *quantized_models(),
        *detection_models(),
        *timm_models(),
        *ecosystem_models(),
    ]


# The quick subset (`make test`): small models at small inputs, about a minute. No detection
# core: the smallest (ssdlite320's) alone takes half that.
_QUICK = (
    ("resnet18", (1, 3, 64, 64)),
    ("mobilenet_v3_small", (1, 3, 64, 64)),
    ("lraspp_mobilenet_v3_large", (1, 3, 64, 64)),
    ("r3d_18", (1, 3, 4, 32, 32)),
    ("quantized_shufflenet_v2_x0_5", (1, 3, 64, 64)),
)


def quick_models() -> list[ZooModel]:
    """The quick subset (``--quick``): five small models resized to small inputs, keyed by name
    and the resized dims (``resnet18@64x64``, ``r3d_18@4x32x32``). Lists the whole catalogue
    first, so it needs timm too."""
    by_name = {m.name: m for m in all_models()}
    return [by_name[name].resized(shape) for name, shape in _QUICK]
