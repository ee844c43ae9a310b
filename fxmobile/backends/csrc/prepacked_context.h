// Context classes whose pickled state is the tuple of their prepack op's arguments.
//
// Upstream's XNNPACK contexts (aten/src/ATen/native/xnnpack/OpContext.h) and Metal contexts
// (aten/src/ATen/native/metal/MetalPrepackOpContext.h) pickle exactly the arguments their
// prepack op received, as a tuple in argument order, and prepack again on __setstate__. The
// tuple types below are those layouts; `PrepackedContext` keeps the tuple as its state and the
// kernel built from it, so a family's context class is its tuple, its clamp rule and its op
// names (see registry.h for how it is registered).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <torch/custom_class.h>

#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "kernel_paths.h"
#include "kernels.h"

namespace fxmobile {

using OptScalar = std::optional<c10::Scalar>;

// (weight, bias, output_min, output_max)
using LinearArgs = std::tuple<at::Tensor, std::optional<at::Tensor>, OptScalar, OptScalar>;
// (weight, bias, stride, padding, dilation, groups, output_min, output_max)
using Conv2dArgs = std::tuple<
    at::Tensor,
    std::optional<at::Tensor>,
    std::vector<int64_t>,
    std::vector<int64_t>,
    std::vector<int64_t>,
    int64_t,
    OptScalar,
    OptScalar>;
// (weight, bias, stride, padding, output_padding, dilation, groups, output_min, output_max)
using TransposeConv2dArgs = std::tuple<
    at::Tensor,
    std::optional<at::Tensor>,
    std::vector<int64_t>,
    std::vector<int64_t>,
    std::vector<int64_t>,
    std::vector<int64_t>,
    int64_t,
    OptScalar,
    OptScalar>;

template <typename Args, typename Kernel>
class PrepackedContext : public torch::CustomClassHolder, public KernelPaths {
 public:
  using State = Args;

  const State& state() const {
    return state_;
  }
  at::Tensor run(const at::Tensor& input) const {
    return kernel_.run(input);
  }
  std::string kernel_path(const at::Tensor& input) const override {
    return kernel_.path(input);
  }
  void force_kernel_path(const std::string& path) const override {
    kernel_.force_path(path);
  }

 protected:
  // `build(state)` returns the kernel; it runs on every construction, unpickling included.
  template <typename Build>
  PrepackedContext(State state, Build build) : state_(std::move(state)), kernel_(build(state_)) {}

 private:
  State state_;
  Kernel kernel_;
};

inline LinearKernel linear_kernel(
    const LinearArgs& a,
    ClampBounds clamp,
    const char* prepack_op,
    const char* run_op) {
  return LinearKernel(std::get<0>(a), std::get<1>(a), clamp, prepack_op, run_op);
}

inline Conv2dKernel conv2d_kernel(
    const Conv2dArgs& a,
    ClampBounds clamp,
    const char* prepack_op,
    const char* run_op) {
  return Conv2dKernel(
      std::get<0>(a),
      std::get<1>(a),
      ConvGeometry::from_args(
          prepack_op, std::get<2>(a), std::get<3>(a), std::get<4>(a), std::nullopt, std::get<5>(a)),
      clamp,
      prepack_op,
      run_op);
}

inline Conv2dKernel conv_transpose2d_kernel(
    const TransposeConv2dArgs& a,
    ClampBounds clamp,
    const char* prepack_op,
    const char* run_op) {
  return Conv2dKernel(
      std::get<0>(a),
      std::get<1>(a),
      ConvGeometry::from_args(
          prepack_op, std::get<2>(a), std::get<3>(a), std::get<5>(a), std::get<4>(a), std::get<6>(a)),
      clamp,
      prepack_op,
      run_op);
}

} // namespace fxmobile
