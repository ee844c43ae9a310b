// A 1x1 convolution (stride 1, no padding, one group) as one matrix product, then one pass
// that adds the bias and clamps: Y = clamp(W X + b). Eager runs a bias fill, the GEMM and a
// separate clamp pass.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "params.h"

namespace fxmobile {

class GemmConv {
 public:
  // True for the convolutions this path computes: 1x1, stride 1, no padding, groups 1.
  static bool applies(const at::Tensor& weight, const ConvGeometry& geometry);

  // `weight` is (Cout, Cin, 1, 1), contiguous float32.
  GemmConv(const at::Tensor& weight, const std::optional<at::Tensor>& bias, ClampBounds clamp);

  // A channels-last input gives a channels-last output (the pixels are the GEMM's rows);
  // any other input is read as NCHW and gives NCHW.
  at::Tensor run(const at::Tensor& input) const;

 private:
  at::Tensor w_; // (Cout, Cin), for NCHW input
  at::Tensor wt_; // (Cin, Cout), for channels-last input
  std::optional<at::Tensor> bias_;
  ClampBounds clamp_;
};

} // namespace fxmobile
