// Direct depthwise convolution on channels-last float32 data, bias and clamp fused.
//
// A depthwise convolution (groups == in_channels == out_channels) does about 9 multiply-adds
// per output element: it is bound by memory and by per-call overhead, not by arithmetic.
// oneDNN's depthwise kernel is fast once running, but reaching it through ATen costs tens of
// microseconds per call (primitive lookup, memory descriptors), more than the work itself on
// the 7x7 and 14x14 maps of mobile networks. This loop reads the NHWC input once, keeps 16
// channels of accumulators in registers, and writes each output once, with no setup.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "params.h"

namespace fxmobile {

struct DepthwiseGeometry {
  int64_t kernel_h, kernel_w;
  int64_t stride_h, stride_w;
  int64_t pad_h, pad_w;
  int64_t dilation_h, dilation_w;
};

// Taps-major weight for `depthwise_nhwc`: from (C, 1, KH, KW) to (KH * KW, C).
at::Tensor depthwise_taps_major(const at::Tensor& weight);

// y = clamp(depthwise_conv(x, weight) + bias, lo, hi); `input` is a channels-last float32
// (N, C, H, W) tensor, `taps` comes from depthwise_taps_major, `bias` may be null. The output is
// channels-last.
at::Tensor depthwise_nhwc(
    const at::Tensor& input,
    const at::Tensor& taps,
    const float* bias,
    const DepthwiseGeometry& geo,
    float lo,
    float hi);

// A depthwise convolution (groups == in_channels == out_channels) prepacked for the loop.
class DepthwiseConv {
 public:
  // True for the convolutions this path computes: one filter per channel, not transposed.
  static bool applies(const at::Tensor& weight, const ConvGeometry& geometry);

  // `weight` is (C, 1, KH, KW), contiguous float32.
  DepthwiseConv(
      const at::Tensor& weight,
      const std::optional<at::Tensor>& bias,
      const ConvGeometry& geometry,
      ClampBounds clamp);

  // Any input layout (an NCHW one is transposed first); the output is channels-last.
  at::Tensor run(const at::Tensor& input) const;

 private:
  at::Tensor taps_; // (KH * KW, C)
  std::optional<at::Tensor> bias_;
  DepthwiseGeometry geo_;
  ClampBounds clamp_;
};

} // namespace fxmobile
