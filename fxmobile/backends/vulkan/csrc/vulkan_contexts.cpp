// The vulkan.*PackedContext classes: validation of the unpacked list and the CPU kernels.
#include "vulkan_contexts.h"

#include <ATen/ATen.h>

#include <limits>

namespace fxmobile::vulkan {
namespace {

// Readers of the unpacked list, each naming the class and element on a type mismatch.
struct Reader {
  const List& list;
  const char* cls;

  c10::IValue at(size_t i) const {
    return list.get(i);
  }
  at::Tensor tensor(size_t i, const char* what) const {
    const auto v = at(i);
    TORCH_CHECK(v.isTensor(), cls, ": ", what, " must be a Tensor, got ", v.tagKind());
    return v.toTensor();
  }
  std::optional<at::Tensor> optional_tensor(size_t i, const char* what) const {
    const auto v = at(i);
    if (v.isNone()) {
      return std::nullopt;
    }
    TORCH_CHECK(v.isTensor(), cls, ": ", what, " must be a Tensor or None, got ", v.tagKind());
    return v.toTensor();
  }
  std::vector<int64_t> ints(size_t i, const char* what) const {
    const auto v = at(i);
    TORCH_CHECK(v.isIntList(), cls, ": ", what, " must be a list of ints, got ", v.tagKind());
    return v.toIntVector();
  }
  int64_t integer(size_t i, const char* what) const {
    const auto v = at(i);
    TORCH_CHECK(v.isInt(), cls, ": ", what, " must be an int, got ", v.tagKind());
    return v.toInt();
  }
  double real(size_t i, const char* what) const {
    const auto v = at(i);
    TORCH_CHECK(
        v.isDouble() || v.isInt(), cls, ": ", what, " must be a float, got ", v.tagKind());
    return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
  }
  bool boolean(size_t i, const char* what) const {
    const auto v = at(i);
    TORCH_CHECK(v.isBool(), cls, ": ", what, " must be a bool, got ", v.tagKind());
    return v.toBool();
  }
  std::optional<c10::Scalar> optional_scalar(size_t i, const char* what) const {
    const auto v = at(i);
    if (v.isNone()) {
      return std::nullopt;
    }
    TORCH_CHECK(v.isScalar(), cls, ": ", what, " must be a number or None, got ", v.tagKind());
    return v.toScalar();
  }
};

void check_length(const List& list, size_t expected, const char* cls, const char* layout) {
  TORCH_CHECK(
      list.size() == expected,
      cls,
      ": expected the unpacked list ",
      layout,
      " (",
      expected,
      " elements), got ",
      list.size(),
      " elements");
}

// Conv1d parameters arrive as the one-element lists of aten::conv1d (an int broadcast by the
// int[2] schema type gives two equal elements); upstream reads element 0.
int64_t first(const std::vector<int64_t>& values, const char* op, const char* what) {
  TORCH_CHECK(
      !values.empty() && values.size() <= 2,
      op,
      ": ",
      what,
      " must have one element for a 1-D convolution, got ",
      values);
  return values[0];
}

} // namespace

// --- convolution -------------------------------------------------------------------------

Conv2dPackedContext::Conv2dPackedContext(List unpacked) : unpacked_(std::move(unpacked)) {
  using namespace conv2d_args;
  const char* cls = "vulkan.Conv2dPackedContext";
  check_length(
      unpacked_,
      kNumArgs,
      cls,
      "[weight, bias, stride, padding, dilation, transposed, quantized, output_padding, "
      "groups, output_min, output_max]");
  const Reader r{unpacked_, cls};
  const bool transposed = r.boolean(kTransposed, "transposed");
  TORCH_CHECK(
      !r.boolean(kQuantized, "quantized"),
      cls,
      ": quantized Vulkan convolutions (create_qconv2d_context, create_qtconv2d_context) are "
      "not supported by fxmobile; quantize for XNNPACK/QNNPACK instead");
  const char* create_op = transposed ? "vulkan_prepack::create_tconv2d_context"
                                     : "vulkan_prepack::create_conv2d_context";
  const char* run_op = transposed ? "vulkan_prepack::run_tconv2d_context"
                                  : "vulkan_prepack::run_conv2d_context";
  ConvGeometry geometry{
      expand_pair(r.ints(kStride, "stride"), create_op, "stride", 1),
      expand_pair(r.ints(kPadding, "padding"), create_op, "padding", 0),
      expand_pair(r.ints(kDilation, "dilation"), create_op, "dilation", 1),
      transposed
          ? expand_pair(r.ints(kOutputPadding, "output_padding"), create_op, "output_padding", 0)
          : std::vector<int64_t>{0, 0},
      r.integer(kGroups, "groups"),
      transposed};
  kernel_ = std::make_unique<Conv2dKernel>(
      r.tensor(kWeight, "weight"),
      r.optional_tensor(kBias, "bias"),
      std::move(geometry),
      ClampBounds::from_scalars(
          r.optional_scalar(kOutputMin, "output_min"), r.optional_scalar(kOutputMax, "output_max")),
      create_op,
      run_op);
}

Conv1dPackedContext::Conv1dPackedContext(List unpacked) : unpacked_(std::move(unpacked)) {
  using namespace conv1d_args;
  const char* cls = "vulkan.Conv1dPackedContext";
  const char* op = "vulkan_prepack::create_conv1d_context";
  check_length(unpacked_, kNumArgs, cls, "[weight, bias, stride, padding, dilation, groups]");
  const Reader r{unpacked_, cls};
  const at::Tensor weight = r.tensor(kWeight, "weight");
  TORCH_CHECK(
      weight.dim() == 3,
      op,
      ": expected a 3-D weight (out_channels, in_channels/groups, kernel_size), got ",
      shape_str(weight));
  ConvGeometry geometry{
      {1, first(r.ints(kStride, "stride"), op, "stride")},
      {0, first(r.ints(kPadding, "padding"), op, "padding")},
      {1, first(r.ints(kDilation, "dilation"), op, "dilation")},
      {0, 0},
      r.integer(kGroups, "groups"),
      /*transposed=*/false};
  kernel_ = std::make_unique<Conv2dKernel>(
      weight.unsqueeze(2),
      r.optional_tensor(kBias, "bias"),
      std::move(geometry),
      ClampBounds{},
      op,
      "vulkan_prepack::run_conv1d_context");
}

at::Tensor Conv1dPackedContext::run(const at::Tensor& input) const {
  TORCH_CHECK(
      input.dim() == 3,
      "vulkan_prepack::run_conv1d_context: expected a 3-D input (N, C, L), got shape ",
      shape_str(input));
  return kernel_->run(input.unsqueeze(2)).squeeze(2).contiguous();
}

std::string Conv1dPackedContext::kernel_path(const at::Tensor& input) const {
  TORCH_CHECK(
      input.dim() == 3,
      "vulkan_prepack::run_conv1d_context: expected a 3-D input (N, C, L), got shape ",
      shape_str(input));
  return kernel_->path(input.unsqueeze(2));
}

// --- linear --------------------------------------------------------------------------------

LinearPackedContext::LinearPackedContext(List unpacked) : unpacked_(std::move(unpacked)) {
  using namespace linear_args;
  const char* cls = "vulkan.LinearPackedContext";
  const char* op = "vulkan_prepack::create_linear_context";
  check_length(unpacked_, kNumArgs, cls, "[weight, bias]");
  const Reader r{unpacked_, cls};
  const at::Tensor weight_t = r.tensor(kWeight, "weight");
  TORCH_CHECK(
      weight_t.dim() == 2,
      op,
      ": expected a 2-D weight of shape (in_features, out_features), i.e. the transposed "
      "nn.Linear weight, got ",
      shape_str(weight_t));
  kernel_ = std::make_unique<LinearKernel>(
      weight_t.t(),
      r.optional_tensor(kBias, "bias"),
      ClampBounds{},
      op,
      "vulkan_prepack::run_linear_context");
}

// --- layer norm ----------------------------------------------------------------------------

LayernormPackedContext::LayernormPackedContext(List unpacked) : unpacked_(std::move(unpacked)) {
  using namespace layernorm_args;
  const char* cls = "vulkan.LayernormPackedContext";
  const char* op = "vulkan_prepack::create_layernorm_context";
  check_length(unpacked_, kNumArgs, cls, "[weight, bias, eps]");
  const Reader r{unpacked_, cls};
  const auto weight = r.optional_tensor(kWeight, "weight");
  const auto bias = r.optional_tensor(kBias, "bias");
  // Upstream's Vulkan layer_norm needs both (elementwise_affine=True).
  TORCH_CHECK(weight && weight->defined(), op, ": Weight must be provided!");
  TORCH_CHECK(bias && bias->defined(), op, ": Bias must be provided!");
  weight_ = weight->detach().contiguous();
  bias_ = bias->detach().contiguous();
  eps_ = r.real(kEps, "eps");
}

at::Tensor LayernormPackedContext::run(
    const at::Tensor& input,
    c10::IntArrayRef normalized_shape) const {
  return at::layer_norm(input, normalized_shape, weight_, bias_, eps_, /*cudnn_enable=*/false);
}

// --- batch norm ----------------------------------------------------------------------------

BatchNormPackedContext::BatchNormPackedContext(List unpacked) : unpacked_(std::move(unpacked)) {
  using namespace batchnorm_args;
  const char* cls = "vulkan.BatchNormPackedContext";
  const char* op = "vulkan_prepack::create_batchnorm_context";
  check_length(unpacked_, kNumArgs, cls, "[weight, bias, running_mean, running_var, eps]");
  const Reader r{unpacked_, cls};
  // Same requirements and messages as upstream's BatchNormPackedContext.
  auto require = [&](size_t i, const char* name, const char* what) {
    const auto t = r.optional_tensor(i, what);
    TORCH_CHECK(t && t->defined(), op, ": ", name, " must be provided!");
    TORCH_CHECK(t->dim() == 1, op, ": ", name, " must have ndim == 1!");
    return t->detach().contiguous();
  };
  weight_ = require(kWeight, "Weight", "weight");
  bias_ = require(kBias, "Bias", "bias");
  running_mean_ = require(kRunningMean, "Running mean", "running_mean");
  running_var_ = require(kRunningVar, "Running var", "running_var");
  const int64_t features = weight_.numel();
  TORCH_CHECK(bias_.numel() == features, op, ": Bias must have the same numel as weight!");
  TORCH_CHECK(
      running_mean_.numel() == features, op, ": Running mean must have the same numel as weight!");
  TORCH_CHECK(
      running_var_.numel() == features, op, ": Running var must have the same numel as weight!");
  eps_ = r.real(kEps, "eps");
}

at::Tensor BatchNormPackedContext::run(const at::Tensor& input) const {
  TORCH_CHECK(
      input.dim() >= 2 && input.size(1) == weight_.numel(),
      "vulkan_prepack::run_batchnorm_context: expected an input of shape (N, ",
      weight_.numel(),
      ", ...), got ",
      shape_str(input));
  return at::batch_norm(
      input,
      weight_,
      bias_,
      running_mean_,
      running_var_,
      /*training=*/false,
      /*momentum=*/0.0,
      eps_,
      /*cudnn_enabled=*/false);
}

// --- GRU / LSTM ----------------------------------------------------------------------------

RnnPackedContext::RnnPackedContext(List unpacked, Kind kind)
    : unpacked_(c10::AnyType::get()), kind_(kind) {
  using namespace rnn_args;
  const bool gru = kind == Kind::kGru;
  const char* cls = gru ? "vulkan.GruPackedContext" : "vulkan.LstmPackedContext";
  const char* op =
      gru ? "vulkan_prepack::create_gru_context" : "vulkan_prepack::create_lstm_context";
  const char* name = gru ? "gru" : "LSTM";
  check_length(
      unpacked,
      kNumArgs,
      cls,
      "[params_cpu, has_biases, num_layers, dropout, train, bidirectional, batch_first]");
  const Reader r{unpacked, cls};
  const auto params_value = r.at(kParams);
  TORCH_CHECK(
      params_value.isTensorList(),
      cls,
      ": params_cpu must be a list of Tensors, got ",
      params_value.tagKind());
  const std::vector<at::Tensor> params = params_value.toTensorVector();
  const bool has_biases = r.boolean(kHasBiases, "has_biases");
  num_layers_ = r.integer(kNumLayers, "num_layers");
  const double dropout = r.real(kDropout, "dropout");
  const bool train = r.boolean(kTrain, "train");
  const bool bidirectional = r.boolean(kBidirectional, "bidirectional");
  batch_first_ = r.boolean(kBatchFirst, "batch_first");

  // The restrictions of upstream's Vulkan GRU/LSTM, with its messages.
  TORCH_CHECK(has_biases, op, ": Vulkan ", name, " expects 'has_biases' to be true.");
  TORCH_CHECK(!train, op, ": Vulkan ", name, " expects 'train' to be false.");
  TORCH_CHECK(!bidirectional, op, ": Vulkan ", name, " expects 'bidirectional' to be false.");
  TORCH_CHECK(
      dropout < std::numeric_limits<double>::epsilon() * 1000,
      op,
      ": Vulkan ",
      name,
      " expects 'dropout' to be 0.0.");
  TORCH_CHECK(num_layers_ >= 1, op, ": num_layers must be positive, got ", num_layers_);

  const int64_t gates = gru ? 3 : 4;
  const auto n = static_cast<int64_t>(params.size());
  if (n == 4 * num_layers_) {
    params_ = params;
  } else if (n == 4 * gates * num_layers_) {
    // Upstream's __getstate__ layout: per layer, per gate, (input weight, input bias,
    // hidden weight, hidden bias). Concatenate the gates back into w_ih, w_hh, b_ih, b_hh.
    for (int64_t l = 0; l < num_layers_; ++l) {
      std::vector<at::Tensor> w_ih, b_ih, w_hh, b_hh;
      for (int64_t g = 0; g < gates; ++g) {
        const int64_t base = l * 4 * gates + 4 * g;
        w_ih.push_back(params[base]);
        b_ih.push_back(params[base + 1]);
        w_hh.push_back(params[base + 2]);
        b_hh.push_back(params[base + 3]);
      }
      params_.push_back(at::cat(w_ih));
      params_.push_back(at::cat(w_hh));
      params_.push_back(at::cat(b_ih));
      params_.push_back(at::cat(b_hh));
    }
  } else {
    TORCH_CHECK(
        false,
        op,
        ": Vulkan ",
        name,
        " expects 'params_cpu' size to be 4 * 'num_layers'. But 'params_cpu' has size: ",
        n,
        " and 'num_layers' is: ",
        num_layers_);
  }

  for (int64_t l = 0; l < num_layers_; ++l) {
    const auto& w_ih = params_[4 * l];
    const auto& w_hh = params_[4 * l + 1];
    const auto& b_ih = params_[4 * l + 2];
    const auto& b_hh = params_[4 * l + 3];
    TORCH_CHECK(
        w_hh.dim() == 2 && w_hh.size(0) % gates == 0,
        op,
        ": layer ",
        l,
        ": w_hh must be 2-D with ",
        gates,
        " * hidden_size rows, got ",
        shape_str(w_hh));
    const int64_t hidden = w_hh.size(0) / gates;
    TORCH_CHECK(
        w_hh.size(1) == hidden && w_ih.dim() == 2 && w_ih.size(0) == gates * hidden &&
            b_ih.dim() == 1 && b_ih.size(0) == gates * hidden && b_hh.dim() == 1 &&
            b_hh.size(0) == gates * hidden && (l == 0 || w_ih.size(1) == hidden),
        op,
        ": layer ",
        l,
        ": inconsistent parameter shapes w_ih ",
        shape_str(w_ih),
        ", w_hh ",
        shape_str(w_hh),
        ", b_ih ",
        shape_str(b_ih),
        ", b_hh ",
        shape_str(b_hh),
        " (projections are not supported)");
  }

  // The state pickles the 4-per-layer list (see vulkan_contexts.h).
  unpacked_ = List(c10::AnyType::get());
  unpacked_.reserve(kNumArgs);
  unpacked_.emplace_back(c10::List<at::Tensor>(params_));
  for (size_t i = kHasBiases; i < kNumArgs; ++i) {
    unpacked_.emplace_back(unpacked.get(i));
  }
  for (auto& p : params_) {
    p = p.detach().contiguous();
  }
}

void RnnPackedContext::check_input(const at::Tensor& input, const char* op) const {
  const char* name = kind_ == Kind::kGru ? "gru" : "LSTM";
  TORCH_CHECK(
      input.dim() == 3,
      op,
      ": Vulkan ",
      name,
      " expects 'input_vk' dims to be 3, got shape ",
      shape_str(input));
  TORCH_CHECK(
      (input.size(0) == 1 && input.size(1) == 1) || batch_first_,
      op,
      ": Vulkan ",
      name,
      " expects batch-first input (batch_first=True), unless batch size and sequence "
      "length are both 1; got input shape ",
      shape_str(input));
}

std::tuple<at::Tensor, at::Tensor> GruPackedContext::run(
    const at::Tensor& input,
    const at::Tensor& hx) const {
  const char* op = "vulkan_prepack::run_gru_context";
  check_input(input, op);
  TORCH_CHECK(hx.dim() == 3, op, ": Vulkan gru expects 'hx_vk' dims to be 3, got ", shape_str(hx));
  return at::gru(
      input,
      hx,
      params_,
      /*has_biases=*/true,
      num_layers_,
      /*dropout=*/0.0,
      /*train=*/false,
      /*bidirectional=*/false,
      batch_first_);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> LstmPackedContext::run(
    const at::Tensor& input,
    const at::Tensor& hx,
    const at::Tensor& cx) const {
  const char* op = "vulkan_prepack::run_lstm_context";
  check_input(input, op);
  TORCH_CHECK(
      hx.dim() == 3 && cx.dim() == 3,
      op,
      ": Vulkan LSTM expects hidden and cell state dims to be 3, got ",
      shape_str(hx),
      " and ",
      shape_str(cx));
  return at::lstm(
      input,
      {hx, cx},
      params_,
      /*has_biases=*/true,
      num_layers_,
      /*dropout=*/0.0,
      /*train=*/false,
      /*bidirectional=*/false,
      batch_first_);
}

} // namespace fxmobile::vulkan
