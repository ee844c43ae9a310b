// What every kernel takes: the clamp bounds fused into an op, the convolution geometry, and
// small helpers on the float32 tensors the fast paths accept.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/util/ArrayRef.h>

#include <optional>
#include <string>
#include <vector>

namespace fxmobile {

// Bounds of a clamp fused into an op; nullopt means unbounded on that side.
struct ClampBounds {
  std::optional<double> min;
  std::optional<double> max;

  static ClampBounds from_scalars(
      const std::optional<c10::Scalar>& min,
      const std::optional<c10::Scalar>& max);

  bool any() const {
    return min.has_value() || max.has_value();
  }
  // min > max cannot be expressed as one oneDNN clip; torch.clamp semantics apply then.
  bool ordered() const {
    return !(min && max && *min > *max);
  }
  float lo() const;
  float hi() const;
  // In-place torch.clamp_ with these bounds (no-op without bounds).
  void apply_(at::Tensor& t) const;
};

// Convolution geometry, already expanded to two spatial dimensions.
struct ConvGeometry {
  std::vector<int64_t> stride;
  std::vector<int64_t> padding;
  std::vector<int64_t> dilation;
  std::vector<int64_t> output_padding; // transposed convolution only
  int64_t groups = 1;
  bool transposed = false;

  // From a prepack op's arguments, each with 1 or 2 elements (the int[2] schema type accepts
  // both); a transposed convolution is one with an output_padding. Errors name `op`.
  static ConvGeometry from_args(
      const char* op,
      c10::IntArrayRef stride,
      c10::IntArrayRef padding,
      c10::IntArrayRef dilation,
      std::optional<c10::IntArrayRef> output_padding,
      int64_t groups);
};

// Expands a 1- or 2-element parameter list to 2 elements, naming `op` and `what` on error.
std::vector<int64_t> expand_pair(
    c10::IntArrayRef values,
    const char* op,
    const char* what,
    int64_t default_value);

// A strided float32 CPU tensor: what the hand-written and oneDNN paths take.
inline bool is_float_cpu(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.layout() == at::kStrided && t.device().is_cpu();
}

inline const float* bias_data(const std::optional<at::Tensor>& bias) {
  return bias ? bias->const_data_ptr<float>() : nullptr;
}

std::string shape_str(const at::Tensor& t);

} // namespace fxmobile
