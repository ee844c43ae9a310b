// Prepacked linear layer: y = x W^T + b, then an optional clamp, as one GEMM (a GEMV split over
// the threads for a single row) and one pass that adds the bias and clamps.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <optional>
#include <string>

#include "params.h"

namespace fxmobile {

class LinearKernel {
 public:
  // kGemm: fxmobile's GEMM (or split GEMV) and fused bias-and-clamp pass; kAten: at::linear,
  // then the clamp (any dtype).
  enum class Path { kAten, kGemm };

  // `weight` is (out_features, in_features). Errors name `prepack_op` or `run_op`.
  LinearKernel(
      const at::Tensor& weight,
      const std::optional<at::Tensor>& bias,
      ClampBounds clamp,
      const char* prepack_op,
      const char* run_op);

  // Any input of shape (..., in_features), like torch.nn.functional.linear.
  at::Tensor run(const at::Tensor& input) const;

  // The name of the path `run` takes for `input`, and forcing one, as in Conv2dKernel.
  const char* path(const at::Tensor& input) const;
  void force_path(const std::string& name) const;

  int64_t in_features() const {
    return weight_.size(1);
  }
  int64_t out_features() const {
    return weight_.size(0);
  }

 private:
  static const char* path_name(Path path);
  Path path_for(const at::Tensor& input) const;
  void check_input(const at::Tensor& input) const;

  std::string op_;
  at::Tensor weight_; // (out_features, in_features), contiguous
  std::optional<at::Tensor> bias_;
  ClampBounds clamp_;
  static constexpr int kNotForced = -1;
  mutable std::atomic<int> forced_{kNotForced}; // a Path, or kNotForced
};

} // namespace fxmobile
