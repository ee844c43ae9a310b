// The Vulkan op family: `vulkan_prepack::create_*_context` / `run_*_context` operators and
// the `vulkan.*PackedContext` classes, with names, schemas and pickled state (a list) of
// upstream PyTorch (aten/src/ATen/native/vulkan/ops/Register.cpp). These are the pairs
// upstream's Vulkan rewrite (torch/csrc/jit/passes/vulkan_rewrite.cpp) emits for linear,
// layer_norm, conv2d, conv_transpose2d, conv1d, gru, lstm and batch_norm.
//
// Left out: the quantized ops (create_qconv2d_context, create_qtconv2d_context,
// run_qconv2d_context, run_qlinear_context, vulkan_quantized::*), and the pre-2022
// backward-compatibility pair conv2d_clamp_prepack/conv2d_clamp_run with vulkan.Conv2dOpContext.
#include "../../csrc/registry.h"
#include "vulkan_contexts.h"

namespace fxmobile::vulkan {
namespace {

using OptScalar = std::optional<c10::Scalar>;
using OptTensor = std::optional<at::Tensor>;

List make_list(std::initializer_list<c10::IValue> values) {
  List list(c10::AnyType::get());
  list.reserve(values.size());
  for (const auto& v : values) {
    list.push_back(v);
  }
  return list;
}

// --- create_*_context: the unpacked list exactly as upstream builds it --------------------

c10::intrusive_ptr<Conv2dPackedContext> create_conv2d_context(
    at::Tensor weight,
    OptTensor bias,
    std::vector<int64_t> stride,
    std::vector<int64_t> padding,
    std::vector<int64_t> dilation,
    int64_t groups,
    const OptScalar& output_min,
    const OptScalar& output_max) {
  return c10::make_intrusive<Conv2dPackedContext>(make_list(
      {weight,
       bias,
       stride,
       padding,
       dilation,
       /*transposed=*/false,
       /*quantized=*/false,
       /*output_padding=*/std::vector<int64_t>{0},
       groups,
       output_min,
       output_max}));
}

c10::intrusive_ptr<Conv2dPackedContext> create_tconv2d_context(
    at::Tensor weight,
    OptTensor bias,
    std::vector<int64_t> stride,
    std::vector<int64_t> padding,
    std::vector<int64_t> output_padding,
    std::vector<int64_t> dilation,
    int64_t groups,
    const OptScalar& output_min,
    const OptScalar& output_max) {
  return c10::make_intrusive<Conv2dPackedContext>(make_list(
      {weight,
       bias,
       stride,
       padding,
       dilation,
       /*transposed=*/true,
       /*quantized=*/false,
       output_padding,
       groups,
       output_min,
       output_max}));
}

c10::intrusive_ptr<Conv1dPackedContext> create_conv1d_context(
    at::Tensor weight,
    OptTensor bias,
    std::vector<int64_t> stride,
    std::vector<int64_t> padding,
    std::vector<int64_t> dilation,
    int64_t groups) {
  return c10::make_intrusive<Conv1dPackedContext>(
      make_list({weight, bias, stride, padding, dilation, groups}));
}

c10::intrusive_ptr<LinearPackedContext> create_linear_context(at::Tensor weight, OptTensor bias) {
  return c10::make_intrusive<LinearPackedContext>(make_list({weight, bias}));
}

c10::intrusive_ptr<LayernormPackedContext> create_layernorm_context(
    OptTensor weight,
    OptTensor bias,
    double eps) {
  return c10::make_intrusive<LayernormPackedContext>(make_list({weight, bias, eps}));
}

c10::intrusive_ptr<BatchNormPackedContext> create_batchnorm_context(
    OptTensor weight,
    OptTensor bias,
    OptTensor running_mean,
    OptTensor running_var,
    bool /*training: upstream ignores it, the kernel is inference-only*/,
    double /*momentum*/,
    double eps,
    bool /*cudnn_enable*/) {
  return c10::make_intrusive<BatchNormPackedContext>(
      make_list({weight, bias, running_mean, running_var, eps}));
}

template <typename Context>
c10::intrusive_ptr<Context> create_rnn_context(
    std::vector<at::Tensor> params,
    bool has_biases,
    int64_t num_layers,
    double dropout,
    bool train,
    bool bidirectional,
    bool batch_first) {
  return c10::make_intrusive<Context>(make_list(
      {c10::List<at::Tensor>(params),
       has_biases,
       num_layers,
       dropout,
       train,
       bidirectional,
       batch_first}));
}

// --- run_*_context ------------------------------------------------------------------------

at::Tensor run_layernorm_context(
    const at::Tensor& input,
    c10::IntArrayRef normalized_shape,
    const c10::intrusive_ptr<LayernormPackedContext>& context) {
  return context->run(input, normalized_shape);
}

std::tuple<at::Tensor, at::Tensor> run_gru_context(
    const at::Tensor& input,
    const at::Tensor& hx,
    const c10::intrusive_ptr<GruPackedContext>& context) {
  return context->run(input, hx);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> run_lstm_context(
    const at::Tensor& input,
    const at::Tensor& hx,
    const at::Tensor& cx,
    const c10::intrusive_ptr<LstmPackedContext>& context) {
  return context->run(input, hx, cx);
}

// --- registration -------------------------------------------------------------------------

void declare(Family& f) {
  f.context<Conv2dPackedContext>("vulkan", "Conv2dPackedContext");
  f.context<Conv1dPackedContext>("vulkan", "Conv1dPackedContext");
  f.context<LinearPackedContext>("vulkan", "LinearPackedContext");
  f.context<LayernormPackedContext>("vulkan", "LayernormPackedContext");
  f.context<BatchNormPackedContext>("vulkan", "BatchNormPackedContext");
  f.context<GruPackedContext>("vulkan", "GruPackedContext");
  f.context<LstmPackedContext>("vulkan", "LstmPackedContext");

  f.op("vulkan_prepack::create_conv2d_context(Tensor W, Tensor? B, int[2] stride, "
       "int[2] padding, int[2] dilation, int groups, "
       "Scalar? output_min=None, Scalar? output_max=None) "
       "-> __torch__.torch.classes.vulkan.Conv2dPackedContext",
       TORCH_FN(create_conv2d_context));
  f.op("vulkan_prepack::run_conv2d_context(Tensor X, "
       "__torch__.torch.classes.vulkan.Conv2dPackedContext W_prepack) -> Tensor Y",
       TORCH_FN(run_op<Conv2dPackedContext>));
  f.op("vulkan_prepack::create_tconv2d_context(Tensor W, Tensor? B, int[2] stride, "
       "int[2] padding, int[2] output_padding, int[2] dilation, int groups, "
       "Scalar? output_min=None, Scalar? output_max=None) "
       "-> __torch__.torch.classes.vulkan.Conv2dPackedContext",
       TORCH_FN(create_tconv2d_context));
  f.op("vulkan_prepack::run_tconv2d_context(Tensor X, "
       "__torch__.torch.classes.vulkan.Conv2dPackedContext W_prepack) -> Tensor Y",
       TORCH_FN(run_op<Conv2dPackedContext>));
  f.op("vulkan_prepack::create_conv1d_context(Tensor W, Tensor? B, int[2] stride, "
       "int[2] padding, int[2] dilation, int groups) "
       "-> __torch__.torch.classes.vulkan.Conv1dPackedContext",
       TORCH_FN(create_conv1d_context));
  f.op("vulkan_prepack::run_conv1d_context(Tensor X, "
       "__torch__.torch.classes.vulkan.Conv1dPackedContext W_prepack) -> Tensor Y",
       TORCH_FN(run_op<Conv1dPackedContext>));
  f.op("vulkan_prepack::create_linear_context(Tensor W, Tensor? B) "
       "-> __torch__.torch.classes.vulkan.LinearPackedContext",
       TORCH_FN(create_linear_context));
  f.op("vulkan_prepack::run_linear_context(Tensor X, "
       "__torch__.torch.classes.vulkan.LinearPackedContext BW_prepack) -> Tensor Y",
       TORCH_FN(run_op<LinearPackedContext>));
  f.op_for_any_device(
      "vulkan_prepack::create_layernorm_context(Tensor? W, Tensor? B, float eps) "
      "-> __torch__.torch.classes.vulkan.LayernormPackedContext",
      &create_layernorm_context);
  f.op("vulkan_prepack::run_layernorm_context(Tensor X, SymInt[] normalized_shape, "
       "__torch__.torch.classes.vulkan.LayernormPackedContext BW_prepack) -> Tensor Y",
       TORCH_FN(run_layernorm_context));
  f.op_for_any_device(
      "vulkan_prepack::create_gru_context(Tensor[] params_cpu, bool has_biases, "
      "int num_layers, float dropout, bool train, bool bidirectional, bool batch_first) "
      "-> __torch__.torch.classes.vulkan.GruPackedContext",
      &create_rnn_context<GruPackedContext>);
  f.op("vulkan_prepack::run_gru_context(Tensor input_vk, Tensor hx_vk, "
       "__torch__.torch.classes.vulkan.GruPackedContext G_prepack) "
       "-> (Tensor next_input, Tensor hidden_layer)",
       TORCH_FN(run_gru_context));
  f.op_for_any_device(
      "vulkan_prepack::create_lstm_context(Tensor[] params_cpu, bool has_biases, "
      "int num_layers, float dropout, bool train, bool bidirectional, bool batch_first) "
      "-> __torch__.torch.classes.vulkan.LstmPackedContext",
      &create_rnn_context<LstmPackedContext>);
  f.op("vulkan_prepack::run_lstm_context(Tensor input_vk, Tensor hx_vk, Tensor cx_vk, "
       "__torch__.torch.classes.vulkan.LstmPackedContext L_prepack) "
       "-> (Tensor next_input, Tensor hidden_state, Tensor cell_state)",
       TORCH_FN(run_lstm_context));
  f.op_for_any_device(
      "vulkan_prepack::create_batchnorm_context(Tensor? weight_opt, Tensor? bias_opt, "
      "Tensor? running_mean_opt, Tensor? running_var_opt, bool training, float momentum, "
      "float eps, bool cudnn_enable) -> __torch__.torch.classes.vulkan.BatchNormPackedContext",
      &create_batchnorm_context);
  f.op("vulkan_prepack::run_batchnorm_context(Tensor input_vk, "
       "__torch__.torch.classes.vulkan.BatchNormPackedContext context) -> Tensor out",
       TORCH_FN(run_op<BatchNormPackedContext>));
}

} // namespace
} // namespace fxmobile::vulkan

namespace fxmobile {

Provider register_vulkan() {
  static Family family("Vulkan", "vulkan_prepack", &vulkan::declare);
  return family.register_once();
}

} // namespace fxmobile
