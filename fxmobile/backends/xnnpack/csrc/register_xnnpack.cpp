// The XNNPACK op family: `prepacked::` operators and `xnnpack.*OpContext` classes.
//
// Names, schemas and pickled state are those of upstream PyTorch
// (aten/src/ATen/native/xnnpack/RegisterOpContextClass.cpp and OpContext.h):
//   __getstate__ is the tuple of the prepack arguments, __setstate__ prepacks again.
// The kernels are fxmobile's CPU kernels (../../csrc/kernels.h), so graphs that use these ops
// build, save, load and run on a torch built without XNNPACK, and load unchanged on one with it.
#include <ATen/core/ivalue.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <memory>
#include <tuple>

#include "../../csrc/kernels.h"
#include "../../csrc/registry.h"

namespace fxmobile::xnnpack {
namespace {

using OptScalar = std::optional<c10::Scalar>;

using LinearState =
    std::tuple<at::Tensor, std::optional<at::Tensor>, OptScalar, OptScalar>;
using Conv2dState = std::tuple<
    at::Tensor,
    std::optional<at::Tensor>,
    std::vector<int64_t>, // stride
    std::vector<int64_t>, // padding
    std::vector<int64_t>, // dilation
    int64_t, // groups
    OptScalar,
    OptScalar>;
using TransposeConv2dState = std::tuple<
    at::Tensor,
    std::optional<at::Tensor>,
    std::vector<int64_t>, // stride
    std::vector<int64_t>, // padding
    std::vector<int64_t>, // output_padding
    std::vector<int64_t>, // dilation
    int64_t, // groups
    OptScalar,
    OptScalar>;

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

class LinearOpContext : public torch::CustomClassHolder {
 public:
  explicit LinearOpContext(LinearState state)
      : state_(std::move(state)),
        kernel_(
            std::get<0>(state_),
            std::get<1>(state_),
            xnnpack_bounds(std::get<2>(state_), std::get<3>(state_), kPrepack),
            kPrepack,
            "prepacked::linear_clamp_run") {}

  const LinearState& state() const {
    return state_;
  }
  at::Tensor run(const at::Tensor& input) const {
    return kernel_.run(input);
  }

  static constexpr const char* kPrepack = "prepacked::linear_clamp_prepack";

 private:
  LinearState state_;
  LinearKernel kernel_;
};

class Conv2dOpContext : public torch::CustomClassHolder {
 public:
  explicit Conv2dOpContext(Conv2dState state)
      : state_(std::move(state)),
        kernel_(
            std::get<0>(state_),
            std::get<1>(state_),
            ConvGeometry{
                expand_pair(std::get<2>(state_), kPrepack, "stride", 1),
                expand_pair(std::get<3>(state_), kPrepack, "padding", 0),
                expand_pair(std::get<4>(state_), kPrepack, "dilation", 1),
                {0, 0},
                std::get<5>(state_),
                /*transposed=*/false},
            xnnpack_bounds(std::get<6>(state_), std::get<7>(state_), kPrepack),
            kPrepack,
            "prepacked::conv2d_clamp_run") {}

  const Conv2dState& state() const {
    return state_;
  }
  at::Tensor run(const at::Tensor& input) const {
    return kernel_.run(input);
  }

  static constexpr const char* kPrepack = "prepacked::conv2d_clamp_prepack";

 private:
  Conv2dState state_;
  Conv2dKernel kernel_;
};

class TransposeConv2dOpContext : public torch::CustomClassHolder {
 public:
  explicit TransposeConv2dOpContext(TransposeConv2dState state)
      : state_(std::move(state)),
        kernel_(
            std::get<0>(state_),
            std::get<1>(state_),
            ConvGeometry{
                expand_pair(std::get<2>(state_), kPrepack, "stride", 1),
                expand_pair(std::get<3>(state_), kPrepack, "padding", 0),
                expand_pair(std::get<5>(state_), kPrepack, "dilation", 1),
                expand_pair(std::get<4>(state_), kPrepack, "output_padding", 0),
                std::get<6>(state_),
                /*transposed=*/true},
            xnnpack_bounds(std::get<7>(state_), std::get<8>(state_), kPrepack),
            kPrepack,
            "prepacked::conv2d_transpose_clamp_run") {}

  const TransposeConv2dState& state() const {
    return state_;
  }
  at::Tensor run(const at::Tensor& input) const {
    return kernel_.run(input);
  }

  static constexpr const char* kPrepack = "prepacked::conv2d_transpose_clamp_prepack";

 private:
  TransposeConv2dState state_;
  Conv2dKernel kernel_;
};

// --- operator kernels ------------------------------------------------------------------

c10::intrusive_ptr<LinearOpContext> linear_clamp_prepack(
    at::Tensor weight,
    std::optional<at::Tensor> bias,
    const OptScalar& output_min,
    const OptScalar& output_max) {
  return c10::make_intrusive<LinearOpContext>(
      LinearState(std::move(weight), std::move(bias), output_min, output_max));
}

at::Tensor linear_clamp_run(
    const at::Tensor& input,
    const c10::intrusive_ptr<LinearOpContext>& context) {
  return context->run(input);
}

c10::intrusive_ptr<Conv2dOpContext> conv2d_clamp_prepack(
    at::Tensor weight,
    std::optional<at::Tensor> bias,
    std::vector<int64_t> stride,
    std::vector<int64_t> padding,
    std::vector<int64_t> dilation,
    int64_t groups,
    const OptScalar& output_min,
    const OptScalar& output_max) {
  return c10::make_intrusive<Conv2dOpContext>(Conv2dState(
      std::move(weight),
      std::move(bias),
      std::move(stride),
      std::move(padding),
      std::move(dilation),
      groups,
      output_min,
      output_max));
}

at::Tensor conv2d_clamp_run(
    const at::Tensor& input,
    const c10::intrusive_ptr<Conv2dOpContext>& context) {
  return context->run(input);
}

c10::intrusive_ptr<TransposeConv2dOpContext> conv2d_transpose_clamp_prepack(
    at::Tensor weight,
    std::optional<at::Tensor> bias,
    std::vector<int64_t> stride,
    std::vector<int64_t> padding,
    std::vector<int64_t> output_padding,
    std::vector<int64_t> dilation,
    int64_t groups,
    const OptScalar& output_min,
    const OptScalar& output_max) {
  return c10::make_intrusive<TransposeConv2dOpContext>(TransposeConv2dState(
      std::move(weight),
      std::move(bias),
      std::move(stride),
      std::move(padding),
      std::move(output_padding),
      std::move(dilation),
      groups,
      output_min,
      output_max));
}

at::Tensor conv2d_transpose_clamp_run(
    const at::Tensor& input,
    const c10::intrusive_ptr<TransposeConv2dOpContext>& context) {
  return context->run(input);
}

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

// --- registration ----------------------------------------------------------------------

const FamilyNames kNames{
    "XNNPACK",
    {"prepacked::linear_clamp_prepack",
     "prepacked::linear_clamp_run",
     "prepacked::conv2d_clamp_prepack",
     "prepacked::conv2d_clamp_run",
     "prepacked::conv2d_transpose_clamp_prepack",
     "prepacked::conv2d_transpose_clamp_run",
     "prepacked::unpack_prepacked_sizes_conv2d",
     "prepacked::unpack_prepacked_sizes_linear"},
    {"xnnpack.LinearOpContext", "xnnpack.Conv2dOpContext", "xnnpack.TransposeConv2dOpContext"}};

// Kept alive for the life of the process: destroying a Library deregisters its ops.
std::unique_ptr<torch::Library> def_library;
std::unique_ptr<torch::Library> cpu_library;

void do_register() {
  // Classes first: the schemas below name them.
  torch::class_<LinearOpContext>("xnnpack", "LinearOpContext")
      .def_pickle(
          [](const c10::intrusive_ptr<LinearOpContext>& self) -> LinearState {
            return self->state();
          },
          [](LinearState state) -> c10::intrusive_ptr<LinearOpContext> {
            return c10::make_intrusive<LinearOpContext>(std::move(state));
          });
  torch::class_<Conv2dOpContext>("xnnpack", "Conv2dOpContext")
      .def_pickle(
          [](const c10::intrusive_ptr<Conv2dOpContext>& self) -> Conv2dState {
            return self->state();
          },
          [](Conv2dState state) -> c10::intrusive_ptr<Conv2dOpContext> {
            return c10::make_intrusive<Conv2dOpContext>(std::move(state));
          });
  torch::class_<TransposeConv2dOpContext>("xnnpack", "TransposeConv2dOpContext")
      .def_pickle(
          [](const c10::intrusive_ptr<TransposeConv2dOpContext>& self)
              -> TransposeConv2dState { return self->state(); },
          [](TransposeConv2dState state) -> c10::intrusive_ptr<TransposeConv2dOpContext> {
            return c10::make_intrusive<TransposeConv2dOpContext>(std::move(state));
          });

  def_library = std::make_unique<torch::Library>(
      torch::Library::DEF, "prepacked", std::nullopt, __FILE__, __LINE__);
  auto& m = *def_library;
  m.def(
      "prepacked::unpack_prepacked_sizes_conv2d(Any W_prepack) -> "
      "(int[], int[]?, int[], int[], int[], int)",
      &unpack_prepacked_sizes_conv2d);
  m.def(
      "prepacked::unpack_prepacked_sizes_linear(Any W_prepack) -> (int[], int[]?)",
      &unpack_prepacked_sizes_linear);
  m.def(
      "prepacked::linear_clamp_prepack(Tensor W, Tensor? B=None, Scalar? output_min=None, "
      "Scalar? output_max=None) -> __torch__.torch.classes.xnnpack.LinearOpContext");
  m.def(
      "prepacked::linear_clamp_run(Tensor X, "
      "__torch__.torch.classes.xnnpack.LinearOpContext W_prepack) -> Tensor Y");
  m.def(
      "prepacked::conv2d_clamp_prepack(Tensor W, Tensor? B, int[2] stride, int[2] padding, "
      "int[2] dilation, int groups, Scalar? output_min=None, Scalar? output_max=None) -> "
      "__torch__.torch.classes.xnnpack.Conv2dOpContext");
  m.def(
      "prepacked::conv2d_transpose_clamp_prepack(Tensor W, Tensor? B, int[2] stride, "
      "int[2] padding, int[2] output_padding, int[2] dilation, int groups, "
      "Scalar? output_min=None, Scalar? output_max=None) -> "
      "__torch__.torch.classes.xnnpack.TransposeConv2dOpContext");
  m.def(
      "prepacked::conv2d_clamp_run(Tensor X, "
      "__torch__.torch.classes.xnnpack.Conv2dOpContext W_prepack) -> Tensor Y");
  m.def(
      "prepacked::conv2d_transpose_clamp_run(Tensor X, "
      "__torch__.torch.classes.xnnpack.TransposeConv2dOpContext W_prepack) -> Tensor Y");

  cpu_library = std::make_unique<torch::Library>(
      torch::Library::IMPL, "prepacked", c10::DispatchKey::CPU, __FILE__, __LINE__);
  auto& cpu = *cpu_library;
  cpu.impl("linear_clamp_prepack", TORCH_FN(linear_clamp_prepack));
  cpu.impl("linear_clamp_run", TORCH_FN(linear_clamp_run));
  cpu.impl("conv2d_clamp_prepack", TORCH_FN(conv2d_clamp_prepack));
  cpu.impl("conv2d_clamp_run", TORCH_FN(conv2d_clamp_run));
  cpu.impl("conv2d_transpose_clamp_prepack", TORCH_FN(conv2d_transpose_clamp_prepack));
  cpu.impl("conv2d_transpose_clamp_run", TORCH_FN(conv2d_transpose_clamp_run));
}

std::optional<Provider> state;
std::mutex state_mutex;

} // namespace
} // namespace fxmobile::xnnpack

namespace fxmobile {

Provider register_xnnpack() {
  return register_once(
      xnnpack::kNames, xnnpack::state, xnnpack::state_mutex, &xnnpack::do_register);
}

} // namespace fxmobile
