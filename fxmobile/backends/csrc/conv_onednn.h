// oneDNN's convolution, reached through ATen's `mkldnn::` operators, with the weight
// reordered once into the blocked layout oneDNN reads (mkldnn::_reorder_convolution_weight;
// eager reorders it on every call) and the bias and clamp fused as post-ops.
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
  at::Tensor packed_weight_for(c10::IntArrayRef input_sizes) const;
  at::Tensor pack_weight(c10::IntArrayRef input_sizes) const;

  at::Tensor weight_;
  std::optional<at::Tensor> bias_;
  ConvGeometry geo_;
  ClampBounds clamp_;
  std::string attr_; // oneDNN post-op: "none", "relu" or "hardtanh"
  c10::List<std::optional<c10::Scalar>> attr_list_; // its scalars, built once

  // Weight reordered for oneDNN, by input size: oneDNN's preferred weight layout can depend
  // on the input's spatial size, so a new size gets its own reorder (once); undefined for a
  // size oneDNN refused.
  mutable std::mutex mutex_;
  mutable std::vector<std::pair<std::vector<int64_t>, at::Tensor>> packed_;
};

} // namespace fxmobile
