// Convolution and linear kernels shared by the three op families; see kernels.h.
#include "kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <string_view>

#include "elementwise.h"

namespace fxmobile {
namespace {

// How an NCHW activation is convolved (channels-last input always goes to oneDNN as is):
//  * oneDNN on NCHW directly, with the plain weight (eager's algorithm, minus its separate clamp
//    pass and weight reorder): for a large input, which a transpose or a GEMM would have to
//    read again from memory, and for an image with few channels (oneDNN has kernels that read
//    such NCHW input directly, e.g. RGB);
//  * a 1x1 convolution on a mid-sized input: a GEMM straight on the NCHW data, then one pass
//    that adds the bias and clamps (output NCHW);
//  * (a channels-last input of a 1x1 convolution on a map up to 28x28, or an expanding one,
//    runs as a GEMM too, output channels-last; a depthwise convolution on a small map runs the
//    direct loop of depthwise.h, either input layout, output channels-last);
//  * otherwise: transposed to channels-last, then oneDNN with the prepacked weight, which
//    writes the channels-last output once with bias and clamp fused. For 1x1 convolutions this
//    wins on tiny images (the transpose is almost free) and for expanding ones (Cout > Cin) on
//    images of 28x28 and up, whose output outweighs the input.
// The thresholds come from measurements on mobilenet_v2/resnet18 shapes (2 threads, AVX-512).
constexpr int64_t kDirectNchwMinInput = 1 << 18;
constexpr int64_t kDirectNchwMaxChannels = 4;
constexpr int64_t kGemmNchwMinPixels = 64;
constexpr int64_t kTransposeExpandingMinPixels = 28 * 28;
// A 1x1 convolution on a channels-last input is one GEMM, (NHW x Cin) (Cin x Cout), plus the
// bias-and-clamp pass: on maps up to 28x28 that beats oneDNN, whose per-call setup dominates
// there (1x1 maps: 1-8 us against 30-40 us), and on expanding convolutions at any size
// (24 -> 144 channels on 56x56: about 0.3 ms against 0.5 ms).
constexpr int64_t kGemmChannelsLastMaxPixels = 28 * 28;
// A depthwise convolution with at most this many output pixels per image runs the direct
// loop (depthwise.h): on a 14x14 map it takes about half of oneDNN's time (most of which is
// per-call setup), on 7x7 a tenth; from 28x28 up oneDNN's blocked kernel is 1.5-4x faster.
constexpr int64_t kDirectDepthwiseMaxPixels = 14 * 14;
// A single-row linear with a weight at least this large splits its GEMV over the threads.
constexpr int64_t kParallelGemvMinWeight = 1 << 16;

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

  bool available(bool transposed) const {
    return transposed ? (conv_transpose && reorder_conv_transpose) : (conv && reorder_conv);
  }
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

std::string shape_str(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

bool is_float_cpu(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.layout() == at::kStrided && t.device().is_cpu();
}

const float* bias_data(const std::optional<at::Tensor>& bias) {
  return bias ? bias->const_data_ptr<float>() : nullptr;
}

} // namespace

// --- ClampBounds -----------------------------------------------------------------------------

ClampBounds ClampBounds::from_scalars(
    const std::optional<c10::Scalar>& min,
    const std::optional<c10::Scalar>& max) {
  ClampBounds b;
  if (min) {
    b.min = min->toDouble();
  }
  if (max) {
    b.max = max->toDouble();
  }
  return b;
}

float ClampBounds::lo() const {
  return min ? static_cast<float>(*min) : -std::numeric_limits<float>::infinity();
}

float ClampBounds::hi() const {
  return max ? static_cast<float>(*max) : std::numeric_limits<float>::infinity();
}

void ClampBounds::apply_(at::Tensor& t) const {
  if (min && max) {
    at::clamp_(t, *min, *max);
  } else if (min) {
    at::clamp_min_(t, *min);
  } else if (max) {
    at::clamp_max_(t, *max);
  }
}

std::vector<int64_t> expand_pair(
    c10::IntArrayRef values,
    const char* op,
    const char* what,
    int64_t default_value) {
  if (values.empty()) {
    return {default_value, default_value};
  }
  TORCH_CHECK(
      values.size() == 1 || values.size() == 2,
      op,
      ": ",
      what,
      " must have 1 or 2 elements (one per spatial dimension), got ",
      values);
  return values.size() == 1 ? std::vector<int64_t>{values[0], values[0]} : values.vec();
}

ConvGeometry ConvGeometry::from_args(
    const char* op,
    c10::IntArrayRef stride,
    c10::IntArrayRef padding,
    c10::IntArrayRef dilation,
    std::optional<c10::IntArrayRef> output_padding,
    int64_t groups) {
  return ConvGeometry{
      expand_pair(stride, op, "stride", 1),
      expand_pair(padding, op, "padding", 0),
      expand_pair(dilation, op, "dilation", 1),
      output_padding ? expand_pair(*output_padding, op, "output_padding", 0)
                     : std::vector<int64_t>{0, 0},
      groups,
      output_padding.has_value()};
}

// --- Conv2dKernel: packing -------------------------------------------------------------------

Conv2dKernel::Conv2dKernel(
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    ConvGeometry geometry,
    ClampBounds clamp,
    const char* prepack_op,
    const char* run_op)
    : op_(run_op), geo_(std::move(geometry)), clamp_(clamp) {
  const char* op = prepack_op;
  if (!geo_.transposed) {
    geo_.output_padding = {0, 0};
  }
  TORCH_CHECK(
      weight.defined() && weight.dim() == 4,
      op,
      ": expected a 4-D weight (",
      geo_.transposed ? "in_channels, out_channels/groups" : "out_channels, in_channels/groups",
      ", kH, kW), got ",
      weight.defined() ? shape_str(weight) : std::string("an undefined tensor"));
  TORCH_CHECK(
      weight.is_floating_point(),
      op,
      ": expected a floating-point weight, got ",
      weight.scalar_type());
  TORCH_CHECK(geo_.groups >= 1, op, ": groups must be positive, got ", geo_.groups);
  for (const auto i : c10::irange(2)) {
    TORCH_CHECK(geo_.stride[i] >= 1, op, ": stride must be positive, got ", geo_.stride);
    TORCH_CHECK(geo_.padding[i] >= 0, op, ": padding must be >= 0, got ", geo_.padding);
    TORCH_CHECK(geo_.dilation[i] >= 1, op, ": dilation must be positive, got ", geo_.dilation);
  }
  TORCH_CHECK(
      weight.size(0) % geo_.groups == 0,
      op,
      ": the weight's first dimension (",
      weight.size(0),
      ") is not divisible by groups = ",
      geo_.groups);
  const int64_t out_channels = geo_.transposed ? weight.size(1) * geo_.groups : weight.size(0);
  if (geo_.transposed) {
    for (const auto i : c10::irange(2)) {
      TORCH_CHECK(
          geo_.output_padding[i] >= 0 &&
              (geo_.output_padding[i] < geo_.stride[i] ||
               geo_.output_padding[i] < geo_.dilation[i]),
          op,
          ": output_padding must be smaller than either stride or dilation, got output_padding=",
          geo_.output_padding,
          ", stride=",
          geo_.stride,
          ", dilation=",
          geo_.dilation);
    }
  }
  if (bias && bias->defined()) {
    TORCH_CHECK(
        bias->dim() == 1 && bias->size(0) == out_channels,
        op,
        ": expected a bias of shape [",
        out_channels,
        "], got ",
        shape_str(*bias));
    bias_ = bias->detach().contiguous();
  }
  weight_ = weight.detach().contiguous();

  const bool float_params = is_float_cpu(weight_) && (!bias_ || is_float_cpu(*bias_));
  const bool pointwise = !geo_.transposed && geo_.groups == 1 && weight_.size(2) == 1 &&
      weight_.size(3) == 1 && geo_.stride == std::vector<int64_t>{1, 1} &&
      geo_.padding == std::vector<int64_t>{0, 0};
  // one filter per channel: groups == in_channels == out_channels
  const bool depthwise = !geo_.transposed && geo_.groups > 1 && weight_.size(1) == 1 &&
      weight_.size(0) == geo_.groups;
  // oneDNN's deconvolution has no output_padding >= stride (ATen makes the same exception).
  const bool big_output_padding = geo_.transposed &&
      (geo_.output_padding[0] >= geo_.stride[0] || geo_.output_padding[1] >= geo_.stride[1]);
  const bool onednn =
      float_params && !big_output_padding && onednn_ops().available(geo_.transposed);
  if (!float_params) {
    path_ = Path::kReference;
  } else if (pointwise) {
    path_ = Path::kGemm;
    gemm_w_ = weight_.view({weight_.size(0), weight_.size(1)});
    gemm_wt_ = gemm_w_.t().contiguous();
  } else if (depthwise && !onednn) {
    path_ = Path::kDepthwise;
  } else if (onednn) {
    path_ = Path::kOneDnn;
  } else {
    path_ = Path::kReference;
  }
  if (depthwise && float_params) {
    has_depthwise_ = true;
    dw_taps_ = depthwise_taps_major(weight_);
    dw_geo_ = DepthwiseGeometry{
        weight_.size(2),
        weight_.size(3),
        geo_.stride[0],
        geo_.stride[1],
        geo_.padding[0],
        geo_.padding[1],
        geo_.dilation[0],
        geo_.dilation[1]};
  }
  if (onednn) {
    has_onednn_ = true;
    if (!clamp_.ordered() || !clamp_.any()) {
      attr_ = "none"; // an unordered clamp is applied afterwards, with torch.clamp semantics
    } else if (clamp_.min && *clamp_.min == 0.0 && !clamp_.max) {
      attr_ = "relu";
    } else {
      attr_ = "hardtanh";
      attr_list_ = scalar_list({clamp_.lo(), clamp_.hi()});
    }
    // The input-independent reorder, done now; a run on a new input size may refine it.
    try {
      packed_.emplace_back(std::vector<int64_t>{}, pack_weight(std::nullopt));
    } catch (const c10::Error&) {
      // A geometry oneDNN has no kernel for: ATen's convolution computes it.
      has_onednn_ = false;
      path_ = pointwise ? Path::kGemm : (depthwise ? Path::kDepthwise : Path::kReference);
    }
  }
}

at::Tensor Conv2dKernel::pack_weight(std::optional<c10::IntArrayRef> input_sizes) const {
  const auto& ops = onednn_ops();
  const c10::IValue size_arg = input_sizes ? c10::IValue(input_sizes->vec()) : c10::IValue();
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

at::Tensor Conv2dKernel::packed_weight_for(c10::IntArrayRef input_sizes) const {
  constexpr size_t kMaxCachedSizes = 8;
  std::lock_guard<std::mutex> guard(mutex_);
  for (const auto& entry : packed_) {
    if (c10::IntArrayRef(entry.first) == input_sizes) {
      return entry.second;
    }
  }
  at::Tensor packed = pack_weight(input_sizes);
  if (packed_.size() >= kMaxCachedSizes) {
    packed_.erase(packed_.begin() + 1); // keep the input-independent entry
  }
  packed_.emplace_back(input_sizes.vec(), packed);
  return packed;
}

// --- Conv2dKernel: running -------------------------------------------------------------------

void Conv2dKernel::check_input(const at::Tensor& input) const {
  TORCH_CHECK(
      input.dim() == 4, op_, ": expected a 4-D input (N, C, H, W), got shape ", shape_str(input));
  const int64_t expected_channels =
      geo_.transposed ? weight_.size(0) : weight_.size(1) * geo_.groups;
  TORCH_CHECK(
      input.size(1) == expected_channels,
      op_,
      ": the input has ",
      input.size(1),
      " channels but the packed weight ",
      shape_str(weight_),
      " with groups=",
      geo_.groups,
      " expects ",
      expected_channels);
}

at::Tensor Conv2dKernel::run(const at::Tensor& input) const {
  check_input(input);
  if (path_ == Path::kReference || !is_float_cpu(input) || input.numel() == 0) {
    return run_reference(input);
  }
  try {
    // The output keeps the input's memory format, as upstream's XNNPACK ops and eager conv do:
    // a program may view the output (flatten) and write the view in place, and a
    // channels-last output of an NCHW input would turn that view into a copy.
    return run_fast(input).contiguous(input.suggest_memory_format());
  } catch (const c10::Error&) {
    // oneDNN refused this input size (it has no kernel for some geometries); ATen's
    // convolution covers every case the prepack validation accepted.
    if (!has_onednn_) {
      throw;
    }
    return run_reference(input);
  }
}

at::Tensor Conv2dKernel::run_fast(const at::Tensor& input) const {
  if (has_onednn_ && !geo_.transposed && input.size(1) == 1 && input.is_contiguous()) {
    // oneDNN's channels-last convolution miscomputes some single-channel inputs (seen with an
    // output width of 1 and a horizontal stride > 1). With one channel, NCHW and channels-last
    // are the same bytes: give oneDNN NCHW strides and take the NCHW route.
    const int64_t h = input.size(2);
    const int64_t w = input.size(3);
    return run_onednn_nchw(input.as_strided(input.sizes(), {h * w, h * w, w, 1}));
  }
  if (has_depthwise_ &&
      (path_ == Path::kDepthwise ||
       output_pixels(input.size(2), input.size(3)) <= kDirectDepthwiseMaxPixels)) {
    return run_depthwise(input);
  }
  const bool channels_last = input.is_contiguous(at::MemoryFormat::ChannelsLast);
  const bool nchw = !channels_last && input.is_contiguous();
  const bool large_nchw = nchw && input.numel() >= kDirectNchwMinInput;
  if (path_ == Path::kGemm) {
    if (!has_onednn_) {
      return run_gemm(input);
    }
    const int64_t pixels = input.size(2) * input.size(3);
    const bool expanding = weight_.size(0) > weight_.size(1);
    if (channels_last && (pixels <= kGemmChannelsLastMaxPixels || expanding)) {
      return run_gemm(input);
    }
    if (!nchw || pixels < kGemmNchwMinPixels ||
        (expanding && pixels >= kTransposeExpandingMinPixels)) {
      return run_onednn(input);
    }
    return large_nchw ? run_onednn_nchw(input) : run_gemm(input);
  }
  if (nchw && !geo_.transposed && (input.size(1) <= kDirectNchwMaxChannels || large_nchw)) {
    return run_onednn_nchw(input);
  }
  return run_onednn(input);
}

at::Tensor Conv2dKernel::run_gemm(const at::Tensor& input) const {
  const int64_t n = input.size(0);
  const int64_t cin = input.size(1);
  const int64_t h = input.size(2);
  const int64_t w = input.size(3);
  const int64_t cout = gemm_w_.size(0);
  const float lo = clamp_.lo();
  const float hi = clamp_.hi();
  if (input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    // Channels-last: the pixels are the rows, Y (NHW x Cout) = X (NHW x Cin) W^T.
    const at::Tensor x = input.permute({0, 2, 3, 1}).reshape({n * h * w, cin});
    at::Tensor y = at::empty({n * h * w, cout}, input.options());
    at::mm_out(y, x, gemm_wt_);
    add_bias_clamp_(
        y.mutable_data_ptr<float>(), n * h * w, cout, bias_data(bias_), false, cout, lo, hi);
    return y.view({n, h, w, cout}).permute({0, 3, 1, 2});
  }
  // NCHW: per image, Y (Cout x HW) = W (Cout x Cin) X (Cin x HW). (Cutting it into per-thread
  // tiles with the bias-and-clamp pass on cache-hot tiles measured slower than BLAS's own
  // threading followed by one pass.)
  const at::Tensor x = input.contiguous().view({n, cin, h * w});
  at::Tensor y = at::empty({n, cout, h, w}, input.options());
  const at::Tensor y3 = y.view({n, cout, h * w});
  for (const auto i : c10::irange(n)) {
    at::Tensor yi = y3.select(0, i);
    at::mm_out(yi, gemm_w_, x.select(0, i));
  }
  add_bias_clamp_(
      y.mutable_data_ptr<float>(), n * cout, h * w, bias_data(bias_), true, cout, lo, hi);
  return y;
}

int64_t Conv2dKernel::output_pixels(int64_t h, int64_t w) const {
  const int64_t span_h = geo_.dilation[0] * (weight_.size(2) - 1) + 1;
  const int64_t span_w = geo_.dilation[1] * (weight_.size(3) - 1) + 1;
  const int64_t out_h = (h + 2 * geo_.padding[0] - span_h) / geo_.stride[0] + 1;
  const int64_t out_w = (w + 2 * geo_.padding[1] - span_w) / geo_.stride[1] + 1;
  return out_h * out_w;
}

at::Tensor Conv2dKernel::run_depthwise(const at::Tensor& input) const {
  at::Tensor x = input;
  if (!x.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    x = x.is_contiguous() ? to_channels_last(x) : x.contiguous(at::MemoryFormat::ChannelsLast);
  }
  return depthwise_nhwc(x, dw_taps_, bias_data(bias_), dw_geo_, clamp_.lo(), clamp_.hi());
}

at::Tensor Conv2dKernel::run_onednn(const at::Tensor& input) const {
  at::Tensor x = input;
  if (!x.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    x = x.is_contiguous() ? to_channels_last(x) : x.contiguous(at::MemoryFormat::ChannelsLast);
  }
  const at::Tensor w = packed_weight_for(x.sizes());
  const auto& ops = onednn_ops();
  at::Tensor y;
  if (geo_.transposed) {
    y = ops.conv_transpose->call(
        x,
        w,
        bias_,
        geo_.padding,
        geo_.output_padding,
        geo_.stride,
        geo_.dilation,
        geo_.groups,
        attr_,
        attr_list_,
        std::nullopt);
  } else {
    y = ops.conv->call(
        x,
        w,
        bias_,
        geo_.padding,
        geo_.stride,
        geo_.dilation,
        geo_.groups,
        attr_,
        attr_list_,
        std::nullopt);
  }
  if (!clamp_.ordered()) {
    clamp_.apply_(y);
  }
  return y;
}

at::Tensor Conv2dKernel::run_onednn_nchw(const at::Tensor& input) const {
  // oneDNN on the NCHW input with the plain weight: it reorders internally, which for a large
  // strided input is cheaper than transposing it; bias and clamp stay fused.
  at::Tensor y = onednn_ops().conv->call(
      input,
      weight_,
      bias_,
      geo_.padding,
      geo_.stride,
      geo_.dilation,
      geo_.groups,
      attr_,
      attr_list_,
      std::nullopt);
  if (!clamp_.ordered()) {
    clamp_.apply_(y);
  }
  return y;
}

at::Tensor Conv2dKernel::run_reference(const at::Tensor& input) const {
  const auto dtype = input.scalar_type();
  at::Tensor y = at::convolution(
      input,
      weight_.to(dtype),
      bias_ ? std::optional<at::Tensor>(bias_->to(dtype)) : std::nullopt,
      geo_.stride,
      geo_.padding,
      geo_.dilation,
      geo_.transposed,
      geo_.output_padding, // {0, 0} unless transposed
      geo_.groups);
  clamp_.apply_(y);
  return y;
}

// --- LinearKernel ----------------------------------------------------------------------------

LinearKernel::LinearKernel(
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    ClampBounds clamp,
    const char* prepack_op,
    const char* run_op)
    : op_(run_op), clamp_(clamp) {
  const char* op = prepack_op;
  TORCH_CHECK(
      weight.defined() && weight.dim() == 2,
      op,
      ": expected a 2-D weight (out_features, in_features), got ",
      weight.defined() ? shape_str(weight) : std::string("an undefined tensor"));
  TORCH_CHECK(
      weight.is_floating_point(),
      op,
      ": expected a floating-point weight, got ",
      weight.scalar_type());
  if (bias && bias->defined()) {
    TORCH_CHECK(
        bias->dim() == 1 && bias->size(0) == weight.size(0),
        op,
        ": expected a bias of shape [",
        weight.size(0),
        "], got ",
        shape_str(*bias));
    bias_ = bias->detach().contiguous();
  }
  weight_ = weight.detach().contiguous();
}

at::Tensor LinearKernel::run(const at::Tensor& input) const {
  TORCH_CHECK(
      input.dim() >= 1 && input.size(-1) == in_features(),
      op_,
      ": expected an input whose last dimension is in_features = ",
      in_features(),
      ", got shape ",
      shape_str(input));
  std::vector<int64_t> out_sizes(input.sizes().begin(), input.sizes().end() - 1);
  out_sizes.push_back(out_features());

  const bool fast =
      is_float_cpu(input) && is_float_cpu(weight_) && (!bias_ || is_float_cpu(*bias_));
  if (!fast) {
    const auto dtype = input.scalar_type();
    at::Tensor y = at::linear(
        input,
        weight_.to(dtype),
        bias_ ? std::optional<at::Tensor>(bias_->to(dtype)) : std::nullopt);
    clamp_.apply_(y);
    return y;
  }

  const at::Tensor x = input.reshape({-1, in_features()});
  const int64_t rows = x.size(0);
  const int64_t n = out_features();
  at::Tensor y = at::empty({rows, n}, input.options());
  if (rows == 1 && weight_.numel() >= kParallelGemvMinWeight && at::get_num_threads() > 1) {
    // One row is a GEMV, which BLAS runs on one thread; split the output features instead,
    // so each thread streams its own block of weight rows.
    const at::Tensor xv = x.select(0, 0);
    const at::Tensor yv = y.select(0, 0);
    const int64_t threads = at::get_num_threads();
    const int64_t grain = std::max<int64_t>(64, (n + threads - 1) / threads);
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
      at::Tensor out = yv.narrow(0, begin, end - begin);
      at::mv_out(out, weight_.narrow(0, begin, end - begin), xv);
    });
  } else {
    at::mm_out(y, x, weight_.t());
  }
  add_bias_clamp_(
      y.mutable_data_ptr<float>(), rows, n, bias_data(bias_), false, n, clamp_.lo(), clamp_.hi());
  return y.view(out_sizes);
}

} // namespace fxmobile
