// The convolution kernel: validation, the choice of path, and ATen's path (see conv2d.h).
#include "conv2d.h"

#include <ATen/ATen.h>
#include <c10/util/irange.h>

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

} // namespace

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

  if (!is_float_cpu(weight_) || (bias_ && !is_float_cpu(*bias_))) {
    return; // ATen's path only
  }
  if (GemmConv::applies(weight_, geo_)) {
    gemm_.emplace(weight_, bias_, clamp_);
  }
  if (DepthwiseConv::applies(weight_, geo_)) {
    depthwise_.emplace(weight_, bias_, geo_, clamp_);
  }
  // oneDNN's deconvolution has no output_padding >= stride (ATen makes the same exception).
  const bool big_output_padding = geo_.transposed &&
      (geo_.output_padding[0] >= geo_.stride[0] || geo_.output_padding[1] >= geo_.stride[1]);
  if (!big_output_padding && OneDnnConv::available(geo_.transposed)) {
    try {
      onednn_.emplace(weight_, bias_, geo_, clamp_);
    } catch (const c10::Error&) {
      // A geometry oneDNN has no kernel for: the other paths compute it.
    }
  }
}

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

Conv2dKernel::Path Conv2dKernel::path_for(const at::Tensor& input) const {
  if ((!gemm_ && !depthwise_ && !onednn_) || !is_float_cpu(input) || input.numel() == 0) {
    return Path::kAten;
  }
  if (onednn_ && !geo_.transposed && input.size(1) == 1 && input.is_contiguous()) {
    return Path::kOneDnnNchw; // see OneDnnConv::run_nchw
  }
  if (depthwise_ &&
      (!onednn_ || output_pixels(input.size(2), input.size(3)) <= kDirectDepthwiseMaxPixels)) {
    return Path::kDepthwise;
  }
  const bool channels_last = input.is_contiguous(at::MemoryFormat::ChannelsLast);
  const bool nchw = !channels_last && input.is_contiguous();
  const bool large_nchw = nchw && input.numel() >= kDirectNchwMinInput;
  if (gemm_) {
    if (!onednn_) {
      return Path::kGemm;
    }
    const int64_t pixels = input.size(2) * input.size(3);
    const bool expanding = weight_.size(0) > weight_.size(1);
    if (channels_last && (pixels <= kGemmChannelsLastMaxPixels || expanding)) {
      return Path::kGemm;
    }
    if (!nchw || pixels < kGemmNchwMinPixels ||
        (expanding && pixels >= kTransposeExpandingMinPixels)) {
      return Path::kOneDnn;
    }
    return large_nchw ? Path::kOneDnnNchw : Path::kGemm;
  }
  if (nchw && !geo_.transposed && (input.size(1) <= kDirectNchwMaxChannels || large_nchw)) {
    return Path::kOneDnnNchw;
  }
  return Path::kOneDnn;
}

at::Tensor Conv2dKernel::run(const at::Tensor& input) const {
  check_input(input);
  const Path path = path_for(input);
  if (path == Path::kAten) {
    return run_aten(input);
  }
  try {
    // The output keeps the input's memory format, as upstream's XNNPACK ops and eager conv do:
    // a program may view the output (flatten) and write the view in place, and a
    // channels-last output of an NCHW input would turn that view into a copy.
    return run_path(path, input).contiguous(input.suggest_memory_format());
  } catch (const c10::Error&) {
    // oneDNN refused this input size (it has no kernel for some geometries); ATen's
    // convolution covers every case the prepack validation accepted.
    if (!onednn_) {
      throw;
    }
    return run_aten(input);
  }
}

at::Tensor Conv2dKernel::run_path(Path path, const at::Tensor& input) const {
  switch (path) {
    case Path::kOneDnn:
      return onednn_->run(input);
    case Path::kOneDnnNchw:
      return onednn_->run_nchw(input);
    case Path::kGemm:
      return gemm_->run(input);
    case Path::kDepthwise:
      return depthwise_->run(input);
    case Path::kAten:
      break;
  }
  return run_aten(input);
}

int64_t Conv2dKernel::output_pixels(int64_t h, int64_t w) const {
  const int64_t span_h = geo_.dilation[0] * (weight_.size(2) - 1) + 1;
  const int64_t span_w = geo_.dilation[1] * (weight_.size(3) - 1) + 1;
  const int64_t out_h = (h + 2 * geo_.padding[0] - span_h) / geo_.stride[0] + 1;
  const int64_t out_w = (w + 2 * geo_.padding[1] - span_w) / geo_.stride[1] + 1;
  return out_h * out_w;
}

at::Tensor Conv2dKernel::run_aten(const at::Tensor& input) const {
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

} // namespace fxmobile
