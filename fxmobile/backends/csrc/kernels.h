// CPU kernels shared by the XNNPACK, Vulkan and Metal op families of fxmobile._C.
//
// Each prepacked op context owns one of these kernels. The kernel does the input-independent
// work once, when the context is created (or unpickled), so that a run does less than the
// eager ops it replaces (conv2d / linear, then a separate clamp):
//   * convolution: the weight is reordered once into the blocked layout oneDNN's convolution
//     reads (mkldnn::_reorder_convolution_weight; eager reorders it on every call), bias and
//     clamp become oneDNN post-ops, and a run is one oneDNN call on a channels-last activation,
//     whose output is channels-last. An NCHW activation is transposed first (blocked AVX
//     transpose), except where that costs more than it saves (see kernels.cpp): a large NCHW
//     input, or one with at most 4 channels, goes to oneDNN as NCHW (output NCHW), and a 1x1
//     convolution on a mid-sized NCHW input runs as a GEMM straight on the NCHW data, with the
//     weight kept as a (Cout, Cin) matrix and one pass that adds the bias and clamps (eager:
//     bias fill, GEMM, separate clamp pass), output NCHW;
//   * linear: one GEMM (a GEMV split over the threads for a single row) and the same fused
//     bias-and-clamp pass.
// The contexts keep the original tensors as their pickled state; kernels are rebuilt from that
// state on load, so nothing here ever reaches a saved file.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/List.h>
#include <c10/core/Scalar.h>

#include "depthwise.h"

#include <mutex>
#include <optional>
#include <string>
#include <utility>
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

// Prepacked 2-D convolution (plain or transposed) followed by an optional clamp.
class Conv2dKernel {
 public:
  // `weight` is OIHW (IOHW for transposed). Errors name `prepack_op` while packing and
  // `run_op` while running.
  Conv2dKernel(
      const at::Tensor& weight,
      const std::optional<at::Tensor>& bias,
      ConvGeometry geometry,
      ClampBounds clamp,
      const char* prepack_op,
      const char* run_op);

  // Runs on a 4-D input of either memory format; the values equal conv2d (or
  // conv_transpose2d) followed by clamp, and the output has the input's memory format (a
  // path that computes channels-last from NCHW input transposes back).
  at::Tensor run(const at::Tensor& input) const;

 private:
  enum class Path { kGemm, kDepthwise, kOneDnn, kReference };

  void check_input(const at::Tensor& input) const;
  at::Tensor run_fast(const at::Tensor& input) const; // float32: GEMM or oneDNN
  at::Tensor run_gemm(const at::Tensor& input) const;
  at::Tensor run_depthwise(const at::Tensor& input) const;
  int64_t output_pixels(int64_t h, int64_t w) const; // per image, not transposed
  at::Tensor run_onednn(const at::Tensor& input) const;
  at::Tensor run_onednn_nchw(const at::Tensor& input) const;
  at::Tensor run_reference(const at::Tensor& input) const;
  at::Tensor packed_weight_for(c10::IntArrayRef input_sizes) const;
  at::Tensor pack_weight(std::optional<c10::IntArrayRef> input_sizes) const;

  std::string op_;
  at::Tensor weight_;
  std::optional<at::Tensor> bias_;
  ConvGeometry geo_;
  ClampBounds clamp_;
  Path path_ = Path::kReference;
  bool has_onednn_ = false; // the weight is packed for oneDNN (packed_ is not empty)
  bool has_depthwise_ = false; // dw_taps_ is set: small maps take the direct loop
  std::string attr_; // oneDNN post-op: "none", "relu" or "hardtanh"
  c10::List<std::optional<c10::Scalar>> attr_list_; // its scalars, built once
  at::Tensor gemm_w_; // (Cout, Cin), for NCHW input on the 1x1 path
  at::Tensor gemm_wt_; // (Cin, Cout), for channels-last input on the 1x1 path
  at::Tensor dw_taps_; // (KH * KW, C), on the depthwise path
  DepthwiseGeometry dw_geo_{};

  // Weight reordered for oneDNN, by input size: oneDNN's preferred weight layout can depend
  // on the input's spatial size, so a new size gets its own reorder (once).
  mutable std::mutex mutex_;
  mutable std::vector<std::pair<std::vector<int64_t>, at::Tensor>> packed_;
};

// Prepacked linear layer: y = x W^T + b, then an optional clamp.
class LinearKernel {
 public:
  // `weight` is (out_features, in_features). Errors name `prepack_op` or `run_op`.
  LinearKernel(
      const at::Tensor& weight,
      const std::optional<at::Tensor>& bias,
      ClampBounds clamp,
      const char* prepack_op,
      const char* run_op);

  // Any input of shape (..., in_features), like torch.nn.functional.linear.
  at::Tensor run(const at::Tensor& input) const;

  int64_t in_features() const {
    return weight_.size(1);
  }
  int64_t out_features() const {
    return weight_.size(0);
  }

 private:
  std::string op_;
  at::Tensor weight_; // (out_features, in_features), contiguous
  std::optional<at::Tensor> bias_;
  ClampBounds clamp_;
};

} // namespace fxmobile
