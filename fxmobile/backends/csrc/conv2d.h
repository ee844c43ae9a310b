// Prepacked 2-D convolution (plain or transposed) followed by an optional clamp.
//
// The kernel validates and prepares everything input-independent once, when its context is
// created or unpickled, then picks one of these paths per run, by the input's layout and size
// (the rules and their measurements are in conv2d.cpp):
//   kOneDnn      oneDNN on a channels-last input with the reordered weight (conv_onednn.h)
//   kOneDnnNchw  oneDNN on the NCHW input as it is, with the plain weight
//   kGemm        a 1x1 convolution as one GEMM plus a bias-and-clamp pass (conv_gemm.h)
//   kDepthwise   fxmobile's direct depthwise loop (depthwise.h)
//   kAten        ATen's convolution then the clamp: any dtype and geometry
// Every path gives conv2d (or conv_transpose2d) followed by clamp, within float rounding, and
// the output has the input's memory format.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <optional>
#include <string>

#include "conv_gemm.h"
#include "conv_onednn.h"
#include "depthwise.h"
#include "params.h"

namespace fxmobile {

class Conv2dKernel {
 public:
  enum class Path { kAten, kOneDnn, kOneDnnNchw, kGemm, kDepthwise };

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

  // The name of the path `run` takes for `input` ("aten", "onednn", "onednn_nchw", "gemm",
  // "depthwise"); the input is checked as `run` checks it.
  const char* path(const at::Tensor& input) const;
  // Makes every float32 run take the named path ("auto": the kernel's own choice again);
  // refuses a path this convolution cannot take. For tests and benchmarks, never pickled.
  void force_path(const std::string& name) const;

 private:
  static const char* path_name(Path path);
  Path path_for(const at::Tensor& input) const; // the forced path, or rule's
  Path rule(const at::Tensor& input) const; // float32 input, a fast path prepared
  bool can_take(Path path) const;

  void check_input(const at::Tensor& input) const;
  at::Tensor run_path(Path path, const at::Tensor& input) const;
  at::Tensor run_aten(const at::Tensor& input) const;
  int64_t output_pixels(int64_t h, int64_t w) const; // per image, not transposed

  std::string op_;
  at::Tensor weight_;
  std::optional<at::Tensor> bias_;
  ConvGeometry geo_;
  ClampBounds clamp_;
  // The paths this convolution can take besides ATen's, prepared at construction.
  std::optional<GemmConv> gemm_;
  std::optional<DepthwiseConv> depthwise_;
  std::optional<OneDnnConv> onednn_;
  static constexpr int kNotForced = -1;
  mutable std::atomic<int> forced_{kNotForced}; // a Path, or kNotForced
};

} // namespace fxmobile
