"""How each kind of zoo model is built: random weights, nothing downloaded.

Quantized models go through eager post-training quantization: BatchNorm statistics randomized,
``fuse_model``, the ``qnnpack`` qconfig (the engine mobile runtimes use), ``prepare``, calibration
on random batches, ``convert``. The model must then run with ``torch.backends.quantized.engine``
set to the same engine (``quantized_engine``).

A whole detector cannot go through fxmobile (``detection_unsupported``); its core — backbone
and dense head on a batched tensor, without the resize/normalize transform before it and the box
decoding and NMS after it — is what a mobile app exports, and that traces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from model_zoo_checks.zoo import ZooModel

QUANTIZED_ENGINE = "qnnpack"

_NOT_TRACEABLE = (
    "torch.fx cannot trace a torchvision detector: its transform iterates over the list of "
    "images and its postprocessing is data-dependent (TraceError 'Proxy object cannot be "
    "iterated'). torch.jit.script works, but the lite interpreter cannot save the scripted "
    "detector: "
)
_IMAGE_LIST = (
    "it holds the TorchScript class ImageList ('__torch__ types other than custom c++ classes "
    "are not supported in lite interpreter', pytorch/vision#4386)"
)
_WITH_BLOCK = (
    "the box loss that scripting compiles along with it (torchvision.models.detection._utils."
    "_box_loss) has a `with torch.no_grad()` block ('ENTER is not supported in mobile module'), "
    "and it holds the TorchScript class ImageList (pytorch/vision#4386)"
)


def detection_unsupported(name: str) -> str:
    """Why the whole detector ``name`` cannot go through fxmobile (checked on torchvision
    0.29.1: the lite interpreter's first refusal is named)."""
    why = _WITH_BLOCK if name.startswith("retinanet") else _IMAGE_LIST
    return f"{_NOT_TRACEABLE}{why}. The {name}_core entry checks its backbone and head."


# Detectors resize their input internally (to 800 px for most); the core takes the batch as
# given, so a size the FPNs divide evenly is enough.
_DETECTION_INPUT = {"ssd300_vgg16": (1, 3, 300, 300)}


def detection_input(name: str) -> tuple[int, ...]:
    """The input shape the zoo feeds detector ``name`` and its core: 1x3x320x320, or 300x300
    for ssd300_vgg16. The detector resizes internally; the core takes the batch as given."""
    return _DETECTION_INPUT.get(name, (1, 3, 320, 320))


def build(entry: ZooModel) -> nn.Module:
    """The bare model of ``entry``, random weights, in training mode; nothing downloaded.

    A layer its library initializes to zero (torchvision's ViT heads) gets random weights: an
    output of zeros would make every numerical check pass whatever the optimized model computes.
    """
    return _without_zero_layers(_build(entry))


def _without_zero_layers(model: nn.Module) -> nn.Module:
    layers = (m for m in model.modules() if isinstance(m, nn.Linear | nn.modules.conv._ConvNd))
    for layer in layers:
        weight = layer.weight
        if isinstance(weight, torch.Tensor) and weight.numel() and not weight.detach().any():
            with torch.no_grad():
                nn.init.normal_(weight, std=0.02)
    return model


def _build(entry: ZooModel) -> nn.Module:
    """``build`` before the zero layers are given weights.

    timm and ecosystem entries go to their own modules; a torchvision builder gets
    ``weights=None`` (and ``weights_backbone=None``), no auxiliary heads, and quantizable models
    come back unquantized (``build_quantized`` quantizes them). A ``_core`` detection entry is
    the detector wrapped in ``DetectionCore``.
    """
    import torchvision

    from model_zoo_checks.zoo import Kind

    if entry.kind is Kind.TIMM:
        from model_zoo_checks import timm_models

        return timm_models.build(entry)
    if entry.kind is Kind.ECOSYSTEM:
        from model_zoo_checks import ecosystem

        return ecosystem.build(entry)
    name = entry.name
    kwargs: dict[str, Any] = {"weights": None}
    if entry.kind is Kind.CLASSIFICATION and name in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=False, init_weights=False)
    elif entry.kind is Kind.SEGMENTATION:
        kwargs["weights_backbone"] = None  # the default downloads ImageNet weights
        if not name.startswith("lraspp"):
            kwargs["aux_loss"] = False
    elif entry.kind is Kind.QUANTIZED:
        kwargs["quantize"] = False
        if name in ("quantized_googlenet", "quantized_inception_v3"):
            kwargs.update(aux_logits=False, init_weights=False)
    elif entry.kind is Kind.DETECTION:
        kwargs["weights_backbone"] = None
        detector = torchvision.models.get_model(name.removesuffix("_core"), **kwargs)
        return DetectionCore(detector) if name.endswith("_core") else detector
    return torchvision.models.get_model(name, **kwargs)


def build_detection(entry: ZooModel, seed: int) -> nn.Module:
    """A detector (or its core) with its backbone's and head's statistics randomized."""
    from fxmobile.verify import randomize_batchnorm_statistics

    model = build(entry)
    core = model if isinstance(model, DetectionCore) else DetectionCore(model)
    # the core shares the detector's modules
    randomize_batchnorm_statistics(core, entry.input_shape, seed)
    return model.eval()


class DetectionCore(nn.Module):
    """A detector's backbone and dense head: a batch in, the head's raw tensors out.

    SSD, RetinaNet and FCOS: their ``head``; the R-CNNs: the region proposal network's head
    (what follows it, proposal selection and RoI heads, is data-dependent).
    """

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.backbone: nn.Module = detector.get_submodule("backbone")
        has_head = isinstance(getattr(detector, "head", None), nn.Module)
        self.head: nn.Module = detector.get_submodule("head" if has_head else "rpn.head")

    def forward(self, x: torch.Tensor) -> Any:
        features = self.backbone(x)
        levels = list(features.values()) if isinstance(features, dict) else [features]
        return self.head(levels)


@contextlib.contextmanager
def quantized_engine(engine: str = QUANTIZED_ENGINE) -> Iterator[None]:
    """Run quantized kernels with ``engine`` inside the block (packed weights are per engine)."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


def build_quantized(entry: ZooModel, seed: int) -> nn.Module:
    """Post-training quantization of a torchvision quantizable model, calibrated on noise."""
    from torch.ao import quantization

    from fxmobile.verify import randomize_batchnorm_statistics

    model = randomize_batchnorm_statistics(build(entry), entry.input_shape, seed)
    with quantized_engine():
        model.fuse_model(is_qat=False)  # type: ignore[operator]
        model.qconfig = quantization.get_default_qconfig(QUANTIZED_ENGINE)
        quantization.prepare(model, inplace=True)
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for _ in range(2):
                model(torch.randn(entry.input_shape, generator=gen) * 1.5 + 0.3)
        quantization.convert(model, inplace=True)
    return model.eval()  # convert leaves the new quantized modules in training mode
