"""The models users bring from other ecosystems, as a zoo kind (``--kind ecosystem``).

Each is built from its configuration exactly as a user builds it, with random weights and
nothing downloaded, and taken as it is: no wrapper around its forward (the target is that each
goes through ``fxmobile.optimize`` with the defaults as it stands). BatchNorm statistics are
randomized the way every zoo model's are (``fxmobile.verify.randomize_batchnorm_statistics``).

- ultralytics YOLOv8n and YOLO11n: ``DetectionModel`` from the yaml shipped in the package, at
  ultralytics' default 640x640. In eval mode forward returns ``(y, preds)``: ``y`` the decoded
  boxes and class scores, (1, 84, 8400); ``preds`` a dict of the raw ``boxes`` and ``scores``
  and the three feature maps ``feats``. ultralytics is AGPL: a test-only dependency.
- Hugging Face transformers vision models, ``XxxForImageClassification(XxxConfig())`` (SegFormer
  ``ForSemanticSegmentation``), at the config's ``image_size`` (224 where it has none; SegFormer
  at 512, its ADE20k size). ``EfficientNetConfig()`` is B7 at 600x600 (64M parameters); the entry
  uses B0's (width and depth 1.0, head 1280, 224x224), as the published B0 config does. Forward
  returns a ``ModelOutput`` (``logits``).
- segmentation_models_pytorch DeepLabV3+ (ResNet-34 encoder), FPN (its EfficientNet-B0 encoder,
  with TF "same" padding) and UNet with a timm encoder (``tu-mobilenetv3_large_100``), all with
  ``encoder_weights=None``, at 256x256.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterable

from torch import nn

from model_zoo_checks.zoo import Kind, ZooModel

_OFFLINE = {"HF_HUB_OFFLINE": "1", "YOLO_OFFLINE": "1"}
# The package each family's builder imports, and what installs them all.
_PACKAGES = {
    "ultralytics": "ultralytics",
    "transformers": "transformers",
    "smp": "segmentation_models_pytorch",
}
INSTALL = "pip install -e '.[ecosystem]'"


def _yolo(cfg: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from ultralytics.nn.tasks import DetectionModel

        return DetectionModel(cfg, verbose=False)

    return build


def _transformers(config: str, model: str, **overrides: object) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        cls = getattr(transformers, model)
        return cls(getattr(transformers, config)(**overrides))

    return build


def _smp(arch: str, encoder: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import segmentation_models_pytorch as smp

        return getattr(smp, arch)(encoder_name=encoder, encoder_weights=None)

    return build


_B0 = {"width_coefficient": 1.0, "depth_coefficient": 1.0, "image_size": 224, "hidden_dim": 1280}

# name: (family, input shape, builder)
_MODELS: dict[str, tuple[str, tuple[int, ...], Callable[[], nn.Module]]] = {
    "ultralytics:yolov8n": ("ultralytics", (1, 3, 640, 640), _yolo("yolov8n.yaml")),
    "ultralytics:yolo11n": ("ultralytics", (1, 3, 640, 640), _yolo("yolo11n.yaml")),
    "transformers:mobilevit": (
        "transformers",
        (1, 3, 256, 256),
        _transformers("MobileViTConfig", "MobileViTForImageClassification"),
    ),
    "transformers:mobilenet_v2": (
        "transformers",
        (1, 3, 224, 224),
        _transformers("MobileNetV2Config", "MobileNetV2ForImageClassification"),
    ),
    "transformers:efficientnet_b0": (
        "transformers",
        (1, 3, 224, 224),
        _transformers("EfficientNetConfig", "EfficientNetForImageClassification", **_B0),
    ),
    "transformers:resnet": (
        "transformers",
        (1, 3, 224, 224),
        _transformers("ResNetConfig", "ResNetForImageClassification"),
    ),
    "transformers:convnext": (
        "transformers",
        (1, 3, 224, 224),
        _transformers("ConvNextConfig", "ConvNextForImageClassification"),
    ),
    "transformers:deit": (
        "transformers",
        (1, 3, 224, 224),
        _transformers("DeiTConfig", "DeiTForImageClassification"),
    ),
    "transformers:swin": (
        "transformers",
        (1, 3, 224, 224),
        _transformers("SwinConfig", "SwinForImageClassification"),
    ),
    "transformers:segformer": (
        "transformers",
        (1, 3, 512, 512),
        _transformers("SegformerConfig", "SegformerForSemanticSegmentation"),
    ),
    "smp:deeplabv3plus_resnet34": (
        "smp",
        (1, 3, 256, 256),
        _smp("DeepLabV3Plus", "resnet34"),
    ),
    "smp:fpn_efficientnet-b0": ("smp", (1, 3, 256, 256), _smp("FPN", "efficientnet-b0")),
    "smp:unet_tu-mobilenetv3_large_100": (
        "smp",
        (1, 3, 256, 256),
        _smp("Unet", "tu-mobilenetv3_large_100"),
    ),
}


def ecosystem_models() -> list[ZooModel]:
    """The catalogue; listing it imports none of the ecosystems."""
    return [ZooModel(n, Kind.ECOSYSTEM, shape, family) for n, (family, shape, _) in _MODELS.items()]


def missing_packages(entries: Iterable[ZooModel]) -> list[str]:
    """The packages the ecosystem entries among ``entries`` need that do not import here, so a
    run can refuse before its first model rather than fail on the first of these an hour in."""
    needed = {_PACKAGES[e.family] for e in entries if e.kind is Kind.ECOSYSTEM}
    return sorted(name for name in needed if importlib.util.find_spec(name) is None)


def build(entry: ZooModel) -> nn.Module:
    """The bare model: random weights, default statistics, training mode. Needs the
    ``ecosystem`` extra (``pip install -e '.[ecosystem]'``)."""
    for key, value in _OFFLINE.items():  # build from configs only: never reach for a hub
        os.environ.setdefault(key, value)
    return _MODELS[entry.name][2]().train()
