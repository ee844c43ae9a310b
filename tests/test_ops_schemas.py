"""fxmobile._C registers the prepacked op families with upstream PyTorch's exact schemas.

The expected strings are upstream's schema text, copied from (in pytorch/pytorch)
aten/src/ATen/native/xnnpack/RegisterOpContextClass.cpp,
aten/src/ATen/native/vulkan/ops/Register.cpp and
aten/src/ATen/native/metal/MetalPrepackOpRegister.cpp (string literals joined). A graph
built here names these operators; a mobile runtime resolves them by name and schema, so any
difference (an argument name, a default, a return type) would break loading there. Also
checked: the context classes exist, registration is per family and idempotent, and the loader
explains what to do when the library is missing.
"""

from __future__ import annotations

import pytest
import torch

from fxmobile.backends import library
from fxmobile.backends.library import (
    ExtensionUnavailableError,
    OpFamily,
    Provider,
    ensure_registered,
    registration_status,
)
from fxmobile.errors import InvalidArgumentError

XNNPACK_SCHEMAS = [
    "prepacked::unpack_prepacked_sizes_conv2d(Any W_prepack) -> (int[], int[]?, int[], int[], "
    "int[], int)",
    "prepacked::unpack_prepacked_sizes_linear(Any W_prepack) -> (int[], int[]?)",
    "prepacked::linear_clamp_prepack(Tensor W, Tensor? B=None, Scalar? output_min=None, "
    "Scalar? output_max=None) -> __torch__.torch.classes.xnnpack.LinearOpContext",
    "prepacked::linear_clamp_run(Tensor X, __torch__.torch.classes.xnnpack.LinearOpContext "
    "W_prepack) -> Tensor Y",
    "prepacked::conv2d_clamp_prepack(Tensor W, Tensor? B, int[2] stride, int[2] padding, "
    "int[2] dilation, int groups, Scalar? output_min=None, Scalar? output_max=None) -> "
    "__torch__.torch.classes.xnnpack.Conv2dOpContext",
    "prepacked::conv2d_transpose_clamp_prepack(Tensor W, Tensor? B, int[2] stride, "
    "int[2] padding, int[2] output_padding, int[2] dilation, int groups, "
    "Scalar? output_min=None, Scalar? output_max=None) -> "
    "__torch__.torch.classes.xnnpack.TransposeConv2dOpContext",
    "prepacked::conv2d_clamp_run(Tensor X, __torch__.torch.classes.xnnpack.Conv2dOpContext "
    "W_prepack) -> Tensor Y",
    "prepacked::conv2d_transpose_clamp_run(Tensor X, "
    "__torch__.torch.classes.xnnpack.TransposeConv2dOpContext W_prepack) -> Tensor Y",
]

VULKAN_SCHEMAS = [
    "vulkan_prepack::create_conv2d_context(Tensor W, Tensor? B, int[2] stride, "
    "int[2] padding, int[2] dilation, int groups, "
    "Scalar? output_min=None, Scalar? output_max=None) "
    "-> __torch__.torch.classes.vulkan.Conv2dPackedContext",
    "vulkan_prepack::run_conv2d_context(Tensor X, "
    "__torch__.torch.classes.vulkan.Conv2dPackedContext W_prepack) -> Tensor Y",
    "vulkan_prepack::create_tconv2d_context(Tensor W, Tensor? B, int[2] stride, "
    "int[2] padding, int[2] output_padding, int[2] dilation, int groups, "
    "Scalar? output_min=None, Scalar? output_max=None) "
    "-> __torch__.torch.classes.vulkan.Conv2dPackedContext",
    "vulkan_prepack::run_tconv2d_context(Tensor X, "
    "__torch__.torch.classes.vulkan.Conv2dPackedContext W_prepack) -> Tensor Y",
    "vulkan_prepack::create_conv1d_context(Tensor W, Tensor? B, int[2] stride, "
    "int[2] padding, int[2] dilation, int groups) "
    "-> __torch__.torch.classes.vulkan.Conv1dPackedContext",
    "vulkan_prepack::run_conv1d_context(Tensor X, "
    "__torch__.torch.classes.vulkan.Conv1dPackedContext W_prepack) -> Tensor Y",
    "vulkan_prepack::create_linear_context(Tensor W, Tensor? B) "
    "-> __torch__.torch.classes.vulkan.LinearPackedContext",
    "vulkan_prepack::run_linear_context(Tensor X, "
    "__torch__.torch.classes.vulkan.LinearPackedContext BW_prepack) -> Tensor Y",
    "vulkan_prepack::create_layernorm_context(Tensor? W, Tensor? B, float eps) "
    "-> __torch__.torch.classes.vulkan.LayernormPackedContext",
    "vulkan_prepack::run_layernorm_context(Tensor X, SymInt[] normalized_shape, "
    "__torch__.torch.classes.vulkan.LayernormPackedContext BW_prepack) -> Tensor Y",
    "vulkan_prepack::create_gru_context(Tensor[] params_cpu, "
    "bool has_biases, "
    "int num_layers, "
    "float dropout, "
    "bool train, "
    "bool bidirectional, "
    "bool batch_first) "
    "-> __torch__.torch.classes.vulkan.GruPackedContext",
    "vulkan_prepack::run_gru_context(Tensor input_vk, "
    "Tensor hx_vk, "
    "__torch__.torch.classes.vulkan.GruPackedContext G_prepack) "
    "-> (Tensor next_input, Tensor hidden_layer)",
    "vulkan_prepack::create_lstm_context(Tensor[] params_cpu, "
    "bool has_biases, "
    "int num_layers, "
    "float dropout, "
    "bool train, "
    "bool bidirectional, "
    "bool batch_first) "
    "-> __torch__.torch.classes.vulkan.LstmPackedContext",
    "vulkan_prepack::run_lstm_context(Tensor input_vk, "
    "Tensor hx_vk, "
    "Tensor cx_vk, "
    "__torch__.torch.classes.vulkan.LstmPackedContext L_prepack) "
    "-> (Tensor next_input, Tensor hidden_state, Tensor cell_state)",
    "vulkan_prepack::create_batchnorm_context("
    "Tensor? weight_opt, "
    "Tensor? bias_opt, "
    "Tensor? running_mean_opt, "
    "Tensor? running_var_opt, "
    "bool training, "
    "float momentum, "
    "float eps, "
    "bool cudnn_enable) "
    "-> __torch__.torch.classes.vulkan.BatchNormPackedContext",
    "vulkan_prepack::run_batchnorm_context("
    "Tensor input_vk, "
    "__torch__.torch.classes.vulkan.BatchNormPackedContext context) "
    "-> Tensor out",
]

METAL_SCHEMAS = [
    "metal_prepack::conv2d_prepack(Tensor W, Tensor? B, int[2] stride, "
    "int[2] padding, int[2] dilation, int groups, "
    "Scalar? output_min=None, Scalar? output_max=None) "
    "-> __torch__.torch.classes.metal.Conv2dOpContext",
    "metal_prepack::conv2d_run(Tensor X, "
    "__torch__.torch.classes.metal.Conv2dOpContext W_prepack) -> Tensor Y",
    "metal_prepack::linear_prepack(Tensor W, Tensor? B, Scalar? output_min=None, "
    "Scalar? output_max=None) -> __torch__.torch.classes.metal.LinearOpContext",
    "metal_prepack::linear_run(Tensor X, __torch__.torch.classes.metal.LinearOpContext "
    "W_prepack) -> Tensor Y",
]

SCHEMAS = {
    OpFamily.XNNPACK: XNNPACK_SCHEMAS,
    OpFamily.VULKAN: VULKAN_SCHEMAS,
    OpFamily.METAL: METAL_SCHEMAS,
}

CLASSES = {
    OpFamily.XNNPACK: ["LinearOpContext", "Conv2dOpContext", "TransposeConv2dOpContext"],
    OpFamily.VULKAN: [
        "Conv2dPackedContext",
        "Conv1dPackedContext",
        "LinearPackedContext",
        "LayernormPackedContext",
        "BatchNormPackedContext",
        "GruPackedContext",
        "LstmPackedContext",
    ],
    OpFamily.METAL: ["Conv2dOpContext", "LinearOpContext"],
}


def _op_name(schema: str) -> str:
    return schema.split("(", 1)[0]


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    registration_status()


@pytest.mark.parametrize(
    ("family", "expected"),
    [(f, s) for f, schemas in SCHEMAS.items() for s in schemas],
    ids=lambda v: _op_name(v) if isinstance(v, str) else v.name,
)
def test_schema_is_upstreams(family: OpFamily, expected: str) -> None:
    registered = [str(s) for s in torch._C._jit_get_schemas_for_operator(_op_name(expected))]
    assert registered == [expected], f"{family.name}: {registered} != [{expected}]"


@pytest.mark.parametrize(
    ("family", "name"), [(f, n) for f, names in CLASSES.items() for n in names]
)
def test_context_class_is_registered(family: OpFamily, name: str) -> None:
    # torch.classes.<ns>.<name> raises for an unknown class; the wrapper lookup is the same check.
    assert torch._C._get_custom_class_python_wrapper(family.value, name) is not None
    getattr(getattr(torch.classes, family.value), name)


def test_this_torch_lacks_the_families_so_fxmobile_provides_them() -> None:
    # torch 2.13+ wheels ship without XNNPACK, Vulkan and Metal (see the upstream reference).
    assert not torch._C._is_xnnpack_enabled()
    assert registration_status() == dict.fromkeys(OpFamily, Provider.FXMOBILE)


def test_registration_is_idempotent() -> None:
    first = {f: ensure_registered(f) for f in OpFamily}
    assert {f: ensure_registered(f) for f in OpFamily} == first
    extension = library._load_extension()
    assert extension.register_family("xnnpack") == "fxmobile"  # C++ side: once, then cached
    assert [
        str(s) for s in torch._C._jit_get_schemas_for_operator("prepacked::linear_clamp_run")
    ] == [XNNPACK_SCHEMAS[3]]


def test_unknown_family_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="OpFamily member"):
        ensure_registered("xnnpack")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown op family"):
        library._load_extension().register_family("opengl")


@pytest.fixture
def fresh_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader as in a new process: nothing registered, fxmobile._C not loaded."""
    monkeypatch.setattr(library, "_status", {})
    monkeypatch.setattr(library, "_extension", None)


def test_missing_library_says_how_to_build_it(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_built(name: str) -> object:
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(library.importlib, "import_module", not_built)
    monkeypatch.setattr(torch._C, "_jit_get_schemas_for_operator", lambda name: [])
    with pytest.raises(ExtensionUnavailableError, match=r"not built.*make install.*C\+\+ compiler"):
        ensure_registered(OpFamily.METAL)


def test_library_built_for_another_torch_says_rebuild(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def wrong_abi(name: str) -> object:
        raise ImportError("_C.so: undefined symbol: _ZN3c104impl3fooEv")

    monkeypatch.setattr(library.importlib, "import_module", wrong_abi)
    monkeypatch.setattr(torch._C, "_jit_get_schemas_for_operator", lambda name: [])
    with pytest.raises(ExtensionUnavailableError, match="different torch; rebuild"):
        ensure_registered(OpFamily.VULKAN)


def test_torch_with_the_family_needs_no_library(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_built(name: str) -> object:
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(library.importlib, "import_module", not_built)
    monkeypatch.setattr(torch._C, "_jit_get_schemas_for_operator", lambda name: ["native"])
    assert ensure_registered(OpFamily.XNNPACK) is Provider.NATIVE
