// oneDNN's convolution, reached through ATen's `mkldnn::` operators, with the weight
// reordered once into the blocked layout oneDNN reads (mkldnn::_reorder_convolution_weight;
// eager reorders it on every call) and the bias and clamp fused as post-ops.
//
// oneDNN's relu and clip post-ops are max/min instructions that return the bound for a NaN,
// where torch.clamp keeps the NaN (as XNNPACK and every other path do). So a run either
//  * fuses the clamp after checking that no accumulator y = sum(x * w) + b can be NaN; there
//    clip(y) = clamp(y) (an infinity goes to its bound in both). For a finite weight and a bias
//    with max|b| <= 2^99,
//        |y| <= max|x| * sum|W| + max|b| <= 2^99 + 2^99 = 2^100
//    when max|x| <= 2^99 / max(sum|W|, 1), and below 2^100 no partial sum, in whatever order or
//    transform oneDNN sums, comes near float's 2^128, so no +Inf and -Inf meet to make a NaN.
//    The check is one read of the input; an input that fails it (a NaN, an infinity, or a
//    magnitude beyond the limit) runs as below;
//  * or runs unfused and clamps the output in fxmobile's NaN-preserving pass (elementwise.h),
//    one read and write of the output.
// The check costs less only where the output is the larger: CPU time per call (2 threads,
// against the NaN-blind fused clamp) was 1.02-1.04x with the check and 1.15-1.20x clamped after
// for mobilenet_v2's 1x1 16->96 on 112x112, 1.21-1.34x and 1.02-1.07x for its stride-2 depthwise
// 96 channels on 112x112. So the check is made for a convolution whose output has at least twice
// its input's elements per pixel of input (Cout >= 2 Cin stride^2; transposed, Cout stride^2 >=
// 2 Cin): an inverted residual's expansion, an RGB stem; every other one clamps after.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "params.h"

namespace fxmobile {

class OneDnnConv {
 public:
  // True when this torch has the oneDNN operators a (transposed) convolution needs.
  static bool available(bool transposed);

  // `weight` is OIHW (IOHW for transposed) float32, contiguous or channels-last. It is
  // reordered for oneDNN on the first run of each input size.
  OneDnnConv(
      const at::Tensor& weight,
      const std::optional<at::Tensor>& bias,
      const ConvGeometry& geometry,
      const ClampBounds& clamp);

  // On a channels-last copy of the input (an NCHW input is transposed first) with the
  // reordered weight; the output is channels-last. An undefined tensor when oneDNN has no
  // kernel for this geometry at this input size (the caller runs ATen's convolution).
  at::Tensor run(const at::Tensor& input) const;

  // On the NCHW input as it is, with the plain weight (oneDNN reorders internally, which for a
  // large input is cheaper than transposing it); not for transposed convolutions. Output NCHW.
  at::Tensor run_nchw(const at::Tensor& input) const;

 private:
  // oneDNN's convolution of `x` with `weight` (packed or plain), then the clamp: fused when
  // every |x| is at most fused_input_limit_, by fxmobile's pass after the convolution otherwise.
  at::Tensor convolve(const at::Tensor& x, const at::Tensor& weight) const;
  at::Tensor packed_weight_for(c10::IntArrayRef input_sizes) const;
  at::Tensor pack_weight(c10::IntArrayRef input_sizes) const;

  at::Tensor weight_;
  std::optional<at::Tensor> bias_;
  ConvGeometry geo_;
  ClampBounds clamp_;
  std::string attr_; // oneDNN post-op: "none", "relu" or "hardtanh"
  c10::List<std::optional<c10::Scalar>> attr_list_; // its scalars, built once
  // The post-op is fused for an input whose every |x| is at most this (see the top of this
  // file); negative when it never is: no clamp, an output smaller than twice the input, or a
  // weight or bias that is not finite.
  float fused_input_limit_ = -1.0f;

  // Weight reordered for oneDNN, by input size: oneDNN's preferred weight layout can depend
  // on the input's spatial size, so a new size gets its own reorder (once); undefined for a
  // size oneDNN refused.
  mutable std::mutex mutex_;
  mutable std::vector<std::pair<std::vector<int64_t>, at::Tensor>> packed_;
};

} // namespace fxmobile
