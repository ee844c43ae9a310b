// oneDNN convolution with a prepacked weight (see conv_onednn.h).
#include "conv_onednn.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "elementwise.h"

namespace fxmobile {
namespace {

// oneDNN entry points, reached through the dispatcher: ATen registers them under the
// `mkldnn::` namespace and has no at:: C++ function for them.
using ConvPointwiseFn = at::Tensor(
    const at::Tensor&,
    const at::Tensor&,
    const std::optional<at::Tensor>&,
    c10::IntArrayRef, // padding
    c10::IntArrayRef, // stride
    c10::IntArrayRef, // dilation
    int64_t, // groups
    std::string_view, // attr
    c10::List<std::optional<c10::Scalar>>, // scalars
    std::optional<std::string_view>); // algorithm

using ConvTransposePointwiseFn = at::Tensor(
    const at::Tensor&,
    const at::Tensor&,
    const std::optional<at::Tensor>&,
    c10::IntArrayRef, // padding
    c10::IntArrayRef, // output_padding
    c10::IntArrayRef, // stride
    c10::IntArrayRef, // dilation
    int64_t, // groups
    std::string_view, // attr
    c10::List<std::optional<c10::Scalar>>, // scalars
    std::optional<std::string_view>); // algorithm

struct OneDnnOps {
  std::optional<c10::TypedOperatorHandle<ConvPointwiseFn>> conv;
  std::optional<c10::TypedOperatorHandle<ConvTransposePointwiseFn>> conv_transpose;
  std::optional<c10::OperatorHandle> reorder_conv;
  std::optional<c10::OperatorHandle> reorder_conv_transpose;
};

// Looked up once. An op that is missing, or whose C++ signature does not match (another
// torch), leaves its slot empty and the kernels fall back to ATen's convolution.
const OneDnnOps& onednn_ops() {
  static const OneDnnOps ops = [] {
    OneDnnOps o;
    if (!at::hasMKLDNN()) {
      return o;
    }
    auto& d = c10::Dispatcher::singleton();
    try {
      if (auto h = d.findSchema({"mkldnn::_convolution_pointwise", ""})) {
        o.conv = h->typed<ConvPointwiseFn>();
      }
      if (auto h = d.findSchema({"mkldnn::_convolution_transpose_pointwise", ""})) {
        o.conv_transpose = h->typed<ConvTransposePointwiseFn>();
      }
    } catch (const c10::Error&) {
      o.conv.reset();
      o.conv_transpose.reset();
    }
    o.reorder_conv = d.findSchema({"mkldnn::_reorder_convolution_weight", ""});
    o.reorder_conv_transpose = d.findSchema({"mkldnn::_reorder_convolution_transpose_weight", ""});
    return o;
  }();
  return ops;
}

at::Tensor call_boxed(const c10::OperatorHandle& op, std::vector<c10::IValue> args) {
  torch::jit::Stack stack(std::move(args));
  op.callBoxed(&stack);
  return stack.back().toTensor();
}

c10::List<std::optional<c10::Scalar>> scalar_list(const std::vector<double>& values) {
  c10::List<std::optional<c10::Scalar>> list;
  list.reserve(values.size());
  for (double v : values) {
    list.push_back(c10::Scalar(v));
  }
  return list;
}

// True when the output has at least twice as many elements as the input (ignoring the borders):
// then checking the input costs less than clamping the output (see conv_onednn.h).
bool output_outgrows_input(const at::Tensor& weight, const ConvGeometry& geo) {
  const int64_t stride_area = geo.stride[0] * geo.stride[1];
  if (geo.transposed) { // weight (Cin, Cout / groups, kH, kW)
    return weight.size(1) * geo.groups * stride_area >= 2 * weight.size(0);
  }
  return weight.size(0) >= 2 * weight.size(1) * geo.groups * stride_area;
}

// The largest max|x| for which y = conv(x, W) + b stays within 2^100 (see conv_onednn.h), or -1
// when no input does: a weight that is not finite (its sum|W| is not) or a bias beyond 2^99 (or
// NaN, which fails the comparison).
float fused_input_limit(const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  constexpr double kHalfSafe = 0x1p99;
  const double weight_l1 = weight.abs().sum(at::kDouble).item<double>();
  const double bias_max =
      bias && bias->numel() > 0 ? bias->abs().max().item<double>() : 0.0;
  if (!std::isfinite(weight_l1) || !(bias_max <= kHalfSafe)) {
    return -1.0f;
  }
  return static_cast<float>(kHalfSafe / std::max(weight_l1, 1.0));
}

} // namespace

bool OneDnnConv::available(bool transposed) {
  const auto& ops = onednn_ops();
  return transposed ? (ops.conv_transpose && ops.reorder_conv_transpose)
                    : (ops.conv && ops.reorder_conv);
}

OneDnnConv::OneDnnConv(
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    const ConvGeometry& geometry,
    const ClampBounds& clamp)
    : weight_(weight), bias_(bias), geo_(geometry), clamp_(clamp) {
  if (!clamp_.ordered() || !clamp_.any()) {
    attr_ = "none"; // an unordered clamp is applied afterwards, with torch.clamp semantics
  } else if (clamp_.min && *clamp_.min == 0.0 && !clamp_.max) {
    attr_ = "relu";
  } else {
    attr_ = "hardtanh";
    attr_list_ = scalar_list({clamp_.lo(), clamp_.hi()});
  }
  if (attr_ != "none" && output_outgrows_input(weight_, geo_)) {
    fused_input_limit_ = fused_input_limit(weight_, bias_);
  }
  // No reorder here: oneDNN's weight layout depends on the input size, so each size gets its
  // own, on its first run (an input-independent one made here was never read, and held a
  // second copy of every weight).
}

at::Tensor OneDnnConv::pack_weight(c10::IntArrayRef input_sizes) const {
  const auto& ops = onednn_ops();
  const c10::IValue size_arg(input_sizes.vec());
  if (geo_.transposed) {
    return call_boxed(
        *ops.reorder_conv_transpose,
        {weight_,
         geo_.padding,
         geo_.output_padding,
         geo_.stride,
         geo_.dilation,
         geo_.groups,
         size_arg});
  }
  return call_boxed(
      *ops.reorder_conv,
      {weight_, geo_.padding, geo_.stride, geo_.dilation, geo_.groups, size_arg});
}

at::Tensor OneDnnConv::packed_weight_for(c10::IntArrayRef input_sizes) const {
  constexpr size_t kMaxCachedSizes = 8;
  std::lock_guard<std::mutex> guard(mutex_);
  for (const auto& entry : packed_) {
    if (c10::IntArrayRef(entry.first) == input_sizes) {
      return entry.second;
    }
  }
  at::Tensor packed;
  try {
    packed = pack_weight(input_sizes);
  } catch (const c10::Error&) {
    // oneDNN has no kernel for this geometry at this size: remembered as an undefined tensor,
    // so later runs of this size go to ATen without raising again.
  }
  if (packed_.size() >= kMaxCachedSizes) {
    packed_.erase(packed_.begin());
  }
  packed_.emplace_back(input_sizes.vec(), packed);
  return packed;
}

at::Tensor OneDnnConv::run(const at::Tensor& input) const {
  at::Tensor x = input;
  if (!x.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    x = x.is_contiguous() ? to_channels_last(x) : x.contiguous(at::MemoryFormat::ChannelsLast);
  }
  const at::Tensor w = packed_weight_for(x.sizes());
  if (!w.defined()) {
    return w;
  }
  return convolve(x, w);
}

at::Tensor OneDnnConv::run_nchw(const at::Tensor& input) const {
  at::Tensor x = input;
  if (x.size(1) == 1 && x.is_contiguous()) {
    // oneDNN's channels-last convolution miscomputes some single-channel inputs (seen with an
    // output width of 1 and a horizontal stride > 1). With one channel, NCHW and channels-last
    // are the same bytes: give oneDNN NCHW strides.
    const int64_t h = x.size(2);
    const int64_t w = x.size(3);
    x = x.as_strided(x.sizes(), {h * w, h * w, w, 1});
  }
  return convolve(x, weight_);
}

at::Tensor OneDnnConv::convolve(const at::Tensor& x, const at::Tensor& weight) const {
  const bool fused = fused_input_limit_ >= 0.0f && all_abs_at_most(x, fused_input_limit_);
  const std::string_view attr = fused ? std::string_view(attr_) : "none";
  const c10::List<std::optional<c10::Scalar>> scalars =
      fused ? attr_list_ : c10::List<std::optional<c10::Scalar>>();
  const auto& ops = onednn_ops();
  at::Tensor y;
  if (geo_.transposed) {
    y = ops.conv_transpose->call(
        x,
        weight,
        bias_,
        geo_.padding,
        geo_.output_padding,
        geo_.stride,
        geo_.dilation,
        geo_.groups,
        attr,
        scalars,
        std::nullopt);
  } else {
    y = ops.conv->call(
        x,
        weight,
        bias_,
        geo_.padding,
        geo_.stride,
        geo_.dilation,
        geo_.groups,
        attr,
        scalars,
        std::nullopt);
  }
  if (!fused) {
    clamp_dense_(y, clamp_.lo(), clamp_.hi()); // NaN stays NaN, as in torch.clamp
  }
  return y;
}

} // namespace fxmobile
