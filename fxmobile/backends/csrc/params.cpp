// Clamp bounds and convolution parameters (see params.h).
#include "params.h"

#include <ATen/ATen.h>

#include <limits>
#include <sstream>

namespace fxmobile {

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

std::string shape_str(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

} // namespace fxmobile
