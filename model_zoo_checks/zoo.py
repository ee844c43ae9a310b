"""The model catalogue: which torchvision models exist, how to build them and what to feed them.

Models are built with random weights (nothing is downloaded) and their BatchNorm statistics are
randomized by a few training-mode forwards before ``.eval()``: with the default statistics
(mean 0, var 1) a folding bug stays invisible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

# Models whose optimization needs most of this machine's memory: run one per process, guarded.
GIANTS = frozenset({"vit_h_14", "regnet_y_128gf"})

# Families whose every BatchNorm must fold away in the FX stage.
BN_FREE_FAMILIES = ("resnet", "mobilenet", "mnasnet", "shufflenet", "regnet", "efficientnet")


@dataclasses.dataclass(frozen=True)
class ZooModel:
    name: str
    kind: str  # classification, segmentation, video, quantized, detection
    input_shape: tuple[int, ...]

    @property
    def family(self) -> str:
        for family in (*BN_FREE_FAMILIES, "resnext", "wide_resnet", "convnext", "densenet", "vgg"):
            if self.name.startswith(family):
                return family
        return self.name.rstrip("0123456789_").split("_")[0]

    def build(self) -> nn.Module:
        import torchvision

        builder: Callable[..., nn.Module] = torchvision.models.get_model_builder(self.name)
        kwargs = {"aux_logits": False, "init_weights": False} if self.name in _NO_AUX else {}
        return builder(weights=None, **kwargs)


_NO_AUX = frozenset({"googlenet", "inception_v3"})
_INPUT = {"inception_v3": (1, 3, 299, 299)}


def classification_models() -> list[ZooModel]:
    import torchvision

    names = torchvision.models.list_models(module=torchvision.models)
    return [ZooModel(n, "classification", _INPUT.get(n, (1, 3, 224, 224))) for n in names]


def randomize_statistics(
    model: nn.Module, input_shape: tuple[int, ...], seed: int = 0
) -> nn.Module:
    """A few training-mode forwards on shifted, scaled noise, then eval (in place; returns it)."""
    torch.manual_seed(seed)
    model.train()
    batch = (2, *input_shape[1:])
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(batch) * 1.5 + 0.3)
    return model.eval()


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
