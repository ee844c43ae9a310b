// The convolution kernel: validation, the choice of path, and ATen's path (see conv2d.h).
#include "conv2d.h"

#include <ATen/ATen.h>
#include <c10/util/irange.h>

#include <algorithm>

namespace fxmobile {
namespace {

// Which path a float32 run takes: a fixed rule on the prepacked geometry and the input's
// layout and size (no timing at run time, so the same input always takes the same path). The
// figures are `benchmarks/bench_prepacked_ops.py --paths` medians (2 threads, AMD EPYC with
// AVX-512; eager = ATen's conv2d + clamp, which is also the `aten` path):
//  * oneDNN with the prepacked weight (kOneDnn) is the default. On a channels-last input it was
//    the fastest path for every dense and grouped convolution of mobilenet_v2, resnet18 and
//    resnext50_32x4d: 0.3-0.9x eager (e.g. 0.41x for resnext's 1x1 256->256 on 56x56, 0.52x
//    for its grouped 3x3 1024 channels on 7x7), since eager reorders the weight on every call
//    and clamps in a separate pass.
//  * A 1x1 convolution runs as one GEMM plus the bias-and-clamp pass (kGemm) only when the
//    work is tiny: oneDNN's per-call setup (30-50 us) then outweighs it (the SE blocks' 1x1
//    maps: 960->240 in 24 us against 51 us), and a product of a few rows is bound by reading the
//    weight (1280->1000 on one pixel: 127 us against 147 us). Above about 0.5M multiply-adds
//    oneDNN wins (96->576 on 4x4: 47 us against 56 us), and by far on large ones, where this
//    machine's BLAS (MKL on an AMD CPU) is 2-5x slower than oneDNN: resnext's 1x1 512->1024
//    on 14x14 took 1.1 ms against 2.6 ms.
//  * A depthwise convolution on a map of up to 14x14 runs fxmobile's direct loop (kDepthwise):
//    0.45-0.7x eager on mobilenet_v2's 14x14 and 7x7 maps, where oneDNN takes 0.65-0.72x; on
//    28x28 oneDNN is faster (192 channels, stride 2: 97 us against 135 us).
//  * An NCHW input is transposed to channels-last for kOneDnn, except where reading it twice
//    costs more than the prepacked kernel saves: then oneDNN reads it as it is (kOneDnnNchw,
//    with the plain weight and the clamp as kOneDnn has it; level with eager or up to 0.5x
//    faster).
//    That is a large input or output (128K elements or more: resnext's 1x1 128->256 on 56x56,
//    1.6 ms against 6.4 ms transposed) and an image with few channels, which oneDNN reads
//    directly (the RGB stem convolutions: 0.55-0.87x eager).
// ATen's path (kAten) is what every other input takes (other dtypes, an empty batch, a
// geometry without a fast path) and what a failed oneDNN call falls back to; measured as a
// choice it was never faster than the path above for these shapes beyond the noise of this
// shared machine (a shape timed alone: level with kOneDnnNchw, which is the same oneDNN call
// with the clamp fused), so the rule does not pick it for float32 input.
// These figures were measured with the clamp fused into every oneDNN call. It is now fused only
// where that keeps NaN (conv_onednn.h), and clamped in a separate pass elsewhere, at 1.00-1.07x
// the fused call's CPU time on mobilenet_v2's and resnet18's shapes.
constexpr int64_t kGemmMaxMacs = 1 << 19;
constexpr int64_t kGemmMaxRows = 4;
constexpr int64_t kDirectDepthwiseMaxPixels = 14 * 14;
constexpr int64_t kDirectNchwMinElements = 1 << 17;
constexpr int64_t kDirectNchwMaxChannels = 4;

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
  // A channels-last weight (fxmobile's channels-last pass stores conv weights so) is kept as it
  // is: oneDNN reorders it from any strides, the 1x1 and depthwise paths read it as they would a
  // contiguous one, and a contiguous copy would only be one more copy of every weight.
  weight_ = weight.detach();
  if (!weight_.is_contiguous() && !weight_.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    weight_ = weight_.contiguous();
  }

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
    // A geometry oneDNN has no kernel for shows on the first run of each input size, which
    // then takes ATen's path (none of 1,440 geometries tried here was refused).
    onednn_.emplace(weight_, bias_, geo_, clamp_);
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
  const int forced = forced_.load(std::memory_order_relaxed);
  const Path path = forced == kNotForced ? rule(input) : static_cast<Path>(forced);
  if (path == Path::kOneDnn && !geo_.transposed && input.size(1) == 1 && input.is_contiguous()) {
    // oneDNN's channels-last convolution miscomputes some single-channel inputs (seen with an
    // output width of 1 and a horizontal stride > 1); see OneDnnConv::run_nchw.
    return Path::kOneDnnNchw;
  }
  return path;
}

Conv2dKernel::Path Conv2dKernel::rule(const at::Tensor& input) const {
  const int64_t n = input.size(0);
  const int64_t pixels = input.size(2) * input.size(3);
  if (depthwise_ && (!onednn_ || pixels <= kDirectDepthwiseMaxPixels)) {
    return Path::kDepthwise;
  }
  if (gemm_ &&
      (!onednn_ || n * pixels <= kGemmMaxRows ||
       n * pixels * weight_.size(0) * weight_.size(1) <= kGemmMaxMacs)) {
    return Path::kGemm;
  }
  const bool nchw = input.is_contiguous() && !input.is_contiguous(at::MemoryFormat::ChannelsLast);
  if (nchw && !geo_.transposed) {
    const int64_t out_elements =
        n * weight_.size(0) * output_pixels(input.size(2), input.size(3));
    if (input.size(1) <= kDirectNchwMaxChannels ||
        std::max(input.numel(), out_elements) >= kDirectNchwMinElements) {
      return Path::kOneDnnNchw;
    }
  }
  return Path::kOneDnn;
}

const char* Conv2dKernel::path_name(Path path) {
  switch (path) {
    case Path::kAten:
      return "aten";
    case Path::kOneDnn:
      return "onednn";
    case Path::kOneDnnNchw:
      return "onednn_nchw";
    case Path::kGemm:
      return "gemm";
    case Path::kDepthwise:
      return "depthwise";
  }
  return "?";
}

const char* Conv2dKernel::path(const at::Tensor& input) const {
  check_input(input);
  return path_name(path_for(input));
}

bool Conv2dKernel::can_take(Path path) const {
  switch (path) {
    case Path::kAten:
      return true;
    case Path::kOneDnn:
      return onednn_.has_value();
    case Path::kOneDnnNchw:
      return onednn_.has_value() && !geo_.transposed;
    case Path::kGemm:
      return gemm_.has_value();
    case Path::kDepthwise:
      return depthwise_.has_value();
  }
  return false;
}

void Conv2dKernel::force_path(const std::string& name) const {
  if (name == "auto") {
    forced_.store(kNotForced);
    return;
  }
  std::string available;
  for (const Path path :
       {Path::kAten, Path::kOneDnn, Path::kOneDnnNchw, Path::kGemm, Path::kDepthwise}) {
    if (!can_take(path)) {
      continue;
    }
    if (name == path_name(path)) {
      forced_.store(static_cast<int>(path));
      return;
    }
    available += std::string(", '") + path_name(path) + "'";
  }
  TORCH_CHECK(
      false,
      op_,
      ": this convolution cannot take the path '",
      name,
      "'; it can take 'auto'",
      available);
}

at::Tensor Conv2dKernel::run(const at::Tensor& input) const {
  check_input(input);
  const Path path = path_for(input);
  at::Tensor y;
  try {
    y = path == Path::kAten ? run_aten(input) : run_path(path, input);
  } catch (const c10::Error&) {
    // oneDNN's convolution refused this input; ATen's convolution covers every case the
    // prepack's validation accepted.
    if (!onednn_ || path == Path::kAten) {
      throw;
    }
  }
  if (!y.defined()) { // refused, or oneDNN has no kernel for this geometry at this size
    y = run_aten(input);
  }
  // The output keeps the input's memory format on every path, as upstream's XNNPACK ops do: a
  // program may view the output (flatten) and write the view in place, and a channels-last
  // output of an NCHW input would turn that view into a copy. (ATen's convolution alone would
  // answer an NCHW input in channels-last when the weight is channels-last.)
  return y.contiguous(input.suggest_memory_format());
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
