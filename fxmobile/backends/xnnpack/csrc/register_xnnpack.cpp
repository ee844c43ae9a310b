// The XNNPACK op family: `prepacked::` operators and `xnnpack.*OpContext` classes.
//
// Names, schemas and pickled state are those of upstream PyTorch
// (aten/src/ATen/native/xnnpack/RegisterOpContextClass.cpp and OpContext.h):
//   __getstate__ is the tuple of the prepack arguments, __setstate__ prepacks again.
// The kernels are fxmobile's CPU kernels (../../csrc/kernels.h), so graphs that use these ops
// build, save, load and run on a torch built without XNNPACK, and load unchanged on one with it.
#include "../../csrc/prepacked_context.h"
#include "../../csrc/registry.h"

namespace fxmobile::xnnpack {
namespace {

// XNNPACK refuses an empty clamp range (xnnpack::internal::*::available checks max > min).
ClampBounds xnnpack_bounds(const OptScalar& min, const OptScalar& max, const char* op) {
  ClampBounds b = ClampBounds::from_scalars(min, max);
  TORCH_CHECK(
      !(b.min && b.max) || *b.max > *b.min,
      op,
      ": output_max must be greater than output_min, got output_min=",
      *b.min,
      ", output_max=",
      *b.max);
  return b;
}

class LinearOpContext : public PrepackedContext<LinearArgs, LinearKernel> {
 public:
  static constexpr const char* kPrepack = "prepacked::linear_clamp_prepack";
  explicit LinearOpContext(State state)
      : PrepackedContext(std::move(state), [](const State& s) {
          return linear_kernel(
              s,
              xnnpack_bounds(std::get<2>(s), std::get<3>(s), kPrepack),
              kPrepack,
              "prepacked::linear_clamp_run");
        }) {}
};

class Conv2dOpContext : public PrepackedContext<Conv2dArgs, Conv2dKernel> {
 public:
  static constexpr const char* kPrepack = "prepacked::conv2d_clamp_prepack";
  explicit Conv2dOpContext(State state)
      : PrepackedContext(std::move(state), [](const State& s) {
          return conv2d_kernel(
              s,
              xnnpack_bounds(std::get<6>(s), std::get<7>(s), kPrepack),
              kPrepack,
              "prepacked::conv2d_clamp_run");
        }) {}
};

class TransposeConv2dOpContext : public PrepackedContext<TransposeConv2dArgs, Conv2dKernel> {
 public:
  static constexpr const char* kPrepack = "prepacked::conv2d_transpose_clamp_prepack";
  explicit TransposeConv2dOpContext(State state)
      : PrepackedContext(std::move(state), [](const State& s) {
          return conv_transpose2d_kernel(
              s,
              xnnpack_bounds(std::get<7>(s), std::get<8>(s), kPrepack),
              kPrepack,
              "prepacked::conv2d_transpose_clamp_run");
        }) {}
};

// Upstream types the argument as Any (to reuse the op for other backends) but accepts only
// its own context class; so does this.
template <typename Context>
c10::intrusive_ptr<Context> expect_context(
    const c10::IValue& value,
    const char* op,
    const char* cls) {
  const auto expected = c10::getCustomClassType<c10::intrusive_ptr<Context>>();
  TORCH_CHECK(
      value.isObject() && value.type() == expected,
      op,
      ": expected a ",
      cls,
      ", got a value of type ",
      value.type()->repr_str());
  return value.toCustomClass<Context>();
}

using Sizes = std::vector<int64_t>;

std::optional<Sizes> optional_sizes(const std::optional<at::Tensor>& t) {
  return (t && t->defined()) ? std::optional<Sizes>(t->sizes().vec()) : std::nullopt;
}

std::tuple<Sizes, std::optional<Sizes>, Sizes, Sizes, Sizes, int64_t>
unpack_prepacked_sizes_conv2d(const c10::IValue& value) {
  const auto context = expect_context<Conv2dOpContext>(
      value, "prepacked::unpack_prepacked_sizes_conv2d", "xnnpack.Conv2dOpContext");
  const auto& s = context->state();
  return {
      std::get<0>(s).sizes().vec(),
      optional_sizes(std::get<1>(s)),
      std::get<2>(s),
      std::get<3>(s),
      std::get<4>(s),
      std::get<5>(s)};
}

std::tuple<Sizes, std::optional<Sizes>> unpack_prepacked_sizes_linear(const c10::IValue& value) {
  const auto context = expect_context<LinearOpContext>(
      value, "prepacked::unpack_prepacked_sizes_linear", "xnnpack.LinearOpContext");
  const auto& s = context->state();
  return {std::get<0>(s).sizes().vec(), optional_sizes(std::get<1>(s))};
}

void declare(Family& f) {
  f.context<LinearOpContext>("xnnpack", "LinearOpContext");
  f.context<Conv2dOpContext>("xnnpack", "Conv2dOpContext");
  f.context<TransposeConv2dOpContext>("xnnpack", "TransposeConv2dOpContext");

  f.op_for_any_device(
      "prepacked::unpack_prepacked_sizes_conv2d(Any W_prepack) -> "
      "(int[], int[]?, int[], int[], int[], int)",
      &unpack_prepacked_sizes_conv2d);
  f.op_for_any_device(
      "prepacked::unpack_prepacked_sizes_linear(Any W_prepack) -> (int[], int[]?)",
      &unpack_prepacked_sizes_linear);
  f.op("prepacked::linear_clamp_prepack(Tensor W, Tensor? B=None, Scalar? output_min=None, "
       "Scalar? output_max=None) -> __torch__.torch.classes.xnnpack.LinearOpContext",
       TORCH_FN(PrepackOp<LinearOpContext>::call));
  f.op("prepacked::linear_clamp_run(Tensor X, "
       "__torch__.torch.classes.xnnpack.LinearOpContext W_prepack) -> Tensor Y",
       TORCH_FN(run_op<LinearOpContext>));
  f.op("prepacked::conv2d_clamp_prepack(Tensor W, Tensor? B, int[2] stride, int[2] padding, "
       "int[2] dilation, int groups, Scalar? output_min=None, Scalar? output_max=None) -> "
       "__torch__.torch.classes.xnnpack.Conv2dOpContext",
       TORCH_FN(PrepackOp<Conv2dOpContext>::call));
  f.op("prepacked::conv2d_transpose_clamp_prepack(Tensor W, Tensor? B, int[2] stride, "
       "int[2] padding, int[2] output_padding, int[2] dilation, int groups, "
       "Scalar? output_min=None, Scalar? output_max=None) -> "
       "__torch__.torch.classes.xnnpack.TransposeConv2dOpContext",
       TORCH_FN(PrepackOp<TransposeConv2dOpContext>::call));
  f.op("prepacked::conv2d_clamp_run(Tensor X, "
       "__torch__.torch.classes.xnnpack.Conv2dOpContext W_prepack) -> Tensor Y",
       TORCH_FN(run_op<Conv2dOpContext>));
  f.op("prepacked::conv2d_transpose_clamp_run(Tensor X, "
       "__torch__.torch.classes.xnnpack.TransposeConv2dOpContext W_prepack) -> Tensor Y",
       TORCH_FN(run_op<TransposeConv2dOpContext>));
}

} // namespace
} // namespace fxmobile::xnnpack

namespace fxmobile {

Provider register_xnnpack() {
  static Family family("XNNPACK", "prepacked", &xnnpack::declare);
  return family.register_once();
}

} // namespace fxmobile
