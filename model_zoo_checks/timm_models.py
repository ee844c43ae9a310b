"""timm's models as a zoo kind (``--kind timm``): a zoo nobody here wrote.

Two parts: one representative of every mobile-class family (``MOBILE``), and a seeded random
sample of the other architectures under 60M parameters (``SAMPLE``). Each is built as a user
builds it, ``timm.create_model(name, pretrained=False)`` (random weights, nothing downloaded),
with batch-1 input of the size its pretrained config names, and its BatchNorm statistics
randomized the way every zoo model's are (``fxmobile.verify.randomize_batchnorm_statistics``).

RepVGG, MobileOne and FastViT train with parallel branches that timm's ``reparameterize_model``
merges for deployment; ``timm:NAME+reparameterized`` is that deployed form (statistics
randomized first, so the merge folds real statistics), beside the trained form.

The sample is drawn by ``sample_names``: timm's model names sorted, shuffled with a fixed seed,
then walked in that order, keeping each name that is not a mobile representative, not one of
timm's ``test_*`` models, takes an image and builds offline on the meta device with fewer than
60M parameters, until ``SAMPLE_SIZE`` are kept. ``SAMPLE`` is that draw for timm 1.0.31, frozen
so listing the catalogue builds nothing; ``python -m model_zoo_checks.timm_models`` draws it
again (a slow test checks the two agree).
"""

from __future__ import annotations

import functools
import os
import random

import torch
from torch import nn

from fxmobile.verify import randomize_batchnorm_statistics
from model_zoo_checks.zoo import Kind, ZooModel

PREFIX = "timm:"  # timm reuses torchvision's names (resnet50, efficientnet_b0): keys stay apart
REPARAMETERIZED = "+reparameterized"

# (family, representative): the smallest common variant of each mobile-class family.
MOBILE = (
    ("mobilenetv2", "mobilenetv2_100"),
    ("mobilenetv3", "mobilenetv3_small_100"),
    ("mobilenetv3", "mobilenetv3_large_100"),
    ("mobilenetv4", "mobilenetv4_conv_small"),
    ("efficientnet", "efficientnet_b0"),
    ("efficientnet_lite", "efficientnet_lite0"),
    ("tf_efficientnet_lite", "tf_efficientnet_lite0"),
    ("tf_efficientnet", "tf_efficientnet_b0"),
    ("tf_efficientnetv2", "tf_efficientnetv2_b0"),
    ("tf_mobilenetv3", "tf_mobilenetv3_small_100"),
    ("tf_mixnet", "tf_mixnet_s"),
    ("mnasnet", "mnasnet_100"),
    ("mnasnet", "semnasnet_100"),
    ("spnasnet", "spnasnet_100"),
    ("fbnet", "fbnetc_100"),
    ("fbnet", "fbnetv3_b"),
    ("mixnet", "mixnet_s"),
    ("ghostnet", "ghostnet_100"),
    ("ghostnet", "ghostnetv2_100"),
    ("lcnet", "lcnet_050"),
    ("hardcorenas", "hardcorenas_a"),
    ("tinynet", "tinynet_e"),
    ("rexnet", "rexnet_100"),
    ("repvgg", "repvgg_a0"),
    ("mobileone", "mobileone_s0"),
    ("fastvit", "fastvit_t8"),
    ("efficientvit", "efficientvit_b0"),
    ("efficientvit", "efficientvit_m0"),
    ("mobilevit", "mobilevit_xxs"),
    ("mobilevit", "mobilevitv2_050"),
    ("levit", "levit_128s"),
    ("efficientformer", "efficientformer_l1"),
    ("efficientformerv2", "efficientformerv2_s0"),
    ("regnet", "regnetx_002"),
    ("regnet", "regnety_002"),
    ("resnet_d", "resnet18d"),
    ("dla", "dla34"),
    ("convnext", "convnext_atto"),
)
# Families whose deployed form is timm's reparameterize_model output.
REPARAMETERIZABLE = ("repvgg_a0", "mobileone_s0", "fastvit_t8")

SAMPLE_SEED = 12  # issue 12
SAMPLE_SIZE = 110
MAX_PARAMS = 60_000_000

# sample_names() for timm 1.0.31 (see the module docstring).
SAMPLE = (
    "nest_tiny",
    "legacy_seresnet101",
    "regnety_004",
    "mobilenetv4_hybrid_large",
    "convnext_zepto_rms",
    "resmlp_24_224",
    "efficientnetv2_s",
    "crossvit_18_dagger_240",
    "ese_vovnet19b_slim",
    "dpn92",
    "cs3darknet_m",
    "tf_efficientnet_cc_b1_8e",
    "hrnet_w18",
    "rexnet_130",
    "eca_nfnet_l2",
    "xcit_small_24_p16_384",
    "efficientnet_b5",
    "efficientvit_m5",
    "ghostnetv3_100",
    "densenet121",
    "tf_efficientnet_lite4",
    "efficientvim_m3_dist",
    "swin_tiny_patch4_window7_224",
    "rexnet_150",
    "deit_tiny_distilled_patch16_224",
    "resmlp_12_224",
    "cpubone_b2pt5_dwnorm",
    "xcit_tiny_12_p8_224",
    "vit_small_patch32_224",
    "tf_mobilenetv3_small_075",
    "xception41",
    "vit_medium_patch16_gap_384",
    "vit_pe_core_small_patch16_384",
    "regnetz_c16_evos",
    "rexnetr_300",
    "resnet50_mlp",
    "ecaresnet50t",
    "tinynet_a",
    "regnetv_040",
    "nf_resnet26",
    "mnasnet_050",
    "efficientvit_m2",
    "regnetx_080",
    "davit_tiny",
    "convnext_femto_ols",
    "efficientnet_cc_b1_8e",
    "regnetx_032",
    "res2net50_14w_8s",
    "resnet50_gn",
    "efficientvim_m1_dist",
    "coatnet_rmlp_1_rw_224",
    "cspresnet50w",
    "crossvit_15_dagger_240",
    "tnt_s_patch16_224",
    "mambaout_femto",
    "vit_medium_patch16_rope_reg1_gap_256",
    "ese_vovnet39b_evos",
    "efficientnet_es_pruned",
    "mobilenet_edgetpu_v2_l",
    "efficientnet_b4",
    "lcnet_075",
    "rexnet_200",
    "cpubone_b3",
    "efficientnet_em",
    "ghostnetv3_050",
    "levit_conv_384",
    "seresnet50",
    "vit_tiny_r_s16_p8_224",
    "fasternet_t2",
    "skresnet18",
    "sequencer2d_m",
    "poolformer_s12",
    "regnetx_016",
    "nextvit_small",
    "mobilenetv4_conv_medium",
    "hgnetv2_b3",
    "vit_tiny_r_s16_p8_384",
    "vit_small_patch16_dinov3_qkvb",
    "mambaout_small_rw",
    "starnet_s3",
    "fasternet_t0",
    "mobilenetv2_140",
    "cpubone_b1_bfrobust",
    "cait_xxs36_384",
    "dpn68b",
    "ecaresnet101d_pruned",
    "hiera_base_224",
    "efficientnet_lite1",
    "hiera_small_224",
    "cs3darknet_focus_s",
    "twins_pcpvt_base",
    "tinynet_b",
    "resnetaa101d",
    "cait_xxs24_224",
    "vit_srelpos_small_patch16_224",
    "res2net101d",
    "lcnetv2_large",
    "efficientvit_b3",
    "dla102x",
    "poolformerv2_s12",
    "swinv2_cr_small_ns_224",
    "convnextv2_femto",
    "vit_tiny_patch16_dinov3_qkvb",
    "mobilenet_edgetpu_v2_xs",
    "volo_d1_384",
    "xcit_small_12_p8_384",
    "sam2_hiera_small",
    "cspresnet50d",
    "regnetz_b16_evos",
    "nf_ecaresnet50",
)


def timm_models() -> list[ZooModel]:
    """The catalogue: the mobile representatives, their deployed forms, then the sample."""
    families = _families()
    entries = [_entry(name, family) for family, name in MOBILE]
    entries += [_entry(name + REPARAMETERIZED, families[name]) for name in REPARAMETERIZABLE]
    entries += [_entry(name, families[name]) for name in SAMPLE]
    return entries


def _entry(name: str, family: str) -> ZooModel:
    return ZooModel(PREFIX + name, Kind.TIMM, input_shape(timm_name(name)), family)


def timm_name(name: str) -> str:
    """timm's name of a catalogue name (``timm:repvgg_a0+reparameterized`` -> ``repvgg_a0``)."""
    return name.removeprefix(PREFIX).removesuffix(REPARAMETERIZED)


def input_shape(name: str) -> tuple[int, ...]:
    """Batch 1 at the size timm's pretrained config for ``name`` names."""
    import timm.models

    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None or len(cfg.input_size) != 3:
        raise ValueError(f"timm model {name!r} has no image input size in its pretrained config")
    return (1, *cfg.input_size)


@functools.cache
def _families() -> dict[str, str]:
    """Each timm model's family: the timm module that defines it (``resnet``, ``byobnet``...)."""
    import timm

    return {n: m for m in timm.list_modules() for n in timm.list_models(module=m)}


def build(entry: ZooModel) -> nn.Module:
    """The bare model: random weights, default statistics, training mode."""
    import timm

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # pretrained=False downloads nothing; make sure
    return timm.create_model(timm_name(entry.name), pretrained=False).train()


def build_randomized(entry: ZooModel, seed: int) -> nn.Module:
    """Statistics randomized, eval mode; then merged by ``reparameterize_model`` for the
    ``+reparameterized`` entries, as timm's deployment recipe does."""
    model = randomize_batchnorm_statistics(build(entry), entry.input_shape, seed)
    if entry.name.endswith(REPARAMETERIZED):
        from timm.utils import reparameterize_model

        model = reparameterize_model(model, inplace=True).eval()
    return model


def parameter_count(name: str) -> int:
    """Parameters of timm's ``name``, built on the meta device (no memory, no init work)."""
    import timm

    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False)
    return sum(p.numel() for p in model.parameters())


def sample_names(
    seed: int = SAMPLE_SEED, size: int = SAMPLE_SIZE, max_params: int = MAX_PARAMS
) -> list[str]:
    """The seeded sample of non-mobile timm architectures (see the module docstring)."""
    import timm

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    taken = {name for _, name in MOBILE}
    names = sorted(timm.list_models())
    random.Random(seed).shuffle(names)
    sample: list[str] = []
    for name in names:
        if len(sample) == size:
            break
        if name in taken or name.startswith("test_"):
            continue
        try:
            input_shape(name)
            params = parameter_count(name)
        except Exception:  # needs a download, or has no image input: not a catalogue model
            continue
        if params < max_params:
            sample.append(name)
    return sample


def main() -> None:
    """Print the sample as the ``SAMPLE`` literal to paste above."""
    print("SAMPLE = (")
    for name in sample_names():
        print(f'    "{name}",')
    print(")")


if __name__ == "__main__":
    main()
