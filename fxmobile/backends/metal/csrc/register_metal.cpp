// The Metal op family: `metal_prepack::` operators and `metal.*OpContext` classes.
//
// Names, schemas and pickled state (a tuple of the prepack arguments) are those of upstream
// PyTorch (aten/src/ATen/native/metal/MetalPrepackOpRegister.cpp, MetalPrepackOpContext.h).
// Upstream's __setstate__ turns the stored weight into a channels-last 4-D tensor (and then
// pickles that one if saved again, which its own LinearOpContext __setstate__ then rejects);
// fxmobile keeps the weight exactly as prepacked, so every save pickles the original tuple.
#include <torch/custom_class.h>
#include <torch/library.h>

#include <memory>
#include <tuple>

#include "../../csrc/kernels.h"
#include "../../csrc/registry.h"

namespace fxmobile::metal {
namespace {

using OptScalar = std::optional<c10::Scalar>;

using Conv2dState = std::tuple<
    at::Tensor,
    std::optional<at::Tensor>,
    std::vector<int64_t>, // stride
    std::vector<int64_t>, // padding
    std::vector<int64_t>, // dilation
    int64_t, // groups
    OptScalar,
    OptScalar>;
using LinearState = std::tuple<at::Tensor, std::optional<at::Tensor>, OptScalar, OptScalar>;

constexpr const char* kConvPrepack = "metal_prepack::conv2d_prepack";
constexpr const char* kLinearPrepack = "metal_prepack::linear_prepack";

class Conv2dOpContext : public torch::CustomClassHolder {
 public:
  explicit Conv2dOpContext(Conv2dState state)
      : state_(std::move(state)),
        kernel_(
            std::get<0>(state_),
            std::get<1>(state_),
            ConvGeometry{
                expand_pair(std::get<2>(state_), kConvPrepack, "stride", 1),
                expand_pair(std::get<3>(state_), kConvPrepack, "padding", 0),
                expand_pair(std::get<4>(state_), kConvPrepack, "dilation", 1),
                {0, 0},
                std::get<5>(state_),
                /*transposed=*/false},
            ClampBounds::from_scalars(std::get<6>(state_), std::get<7>(state_)),
            kConvPrepack,
            "metal_prepack::conv2d_run") {}

  const Conv2dState& state() const {
    return state_;
  }
  at::Tensor run(const at::Tensor& input) const {
    return kernel_.run(input);
  }

 private:
  Conv2dState state_;
  Conv2dKernel kernel_;
};

class LinearOpContext : public torch::CustomClassHolder {
 public:
  explicit LinearOpContext(LinearState state)
      : state_(std::move(state)),
        kernel_(
            std::get<0>(state_),
            std::get<1>(state_),
            ClampBounds::from_scalars(std::get<2>(state_), std::get<3>(state_)),
            kLinearPrepack,
            "metal_prepack::linear_run") {}

  const LinearState& state() const {
    return state_;
  }
  at::Tensor run(const at::Tensor& input) const {
    return kernel_.run(input);
  }

 private:
  LinearState state_;
  LinearKernel kernel_;
};

c10::intrusive_ptr<Conv2dOpContext> conv2d_prepack(
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

at::Tensor conv2d_run(const at::Tensor& input, const c10::intrusive_ptr<Conv2dOpContext>& context) {
  return context->run(input);
}

c10::intrusive_ptr<LinearOpContext> linear_prepack(
    at::Tensor weight,
    std::optional<at::Tensor> bias,
    const OptScalar& output_min,
    const OptScalar& output_max) {
  return c10::make_intrusive<LinearOpContext>(
      LinearState(std::move(weight), std::move(bias), output_min, output_max));
}

at::Tensor linear_run(const at::Tensor& input, const c10::intrusive_ptr<LinearOpContext>& context) {
  return context->run(input);
}

const FamilyNames kNames{
    "Metal",
    {"metal_prepack::conv2d_prepack",
     "metal_prepack::conv2d_run",
     "metal_prepack::linear_prepack",
     "metal_prepack::linear_run"},
    {"metal.Conv2dOpContext", "metal.LinearOpContext"}};

std::unique_ptr<torch::Library> def_library;
std::unique_ptr<torch::Library> cpu_library;

void do_register() {
  torch::class_<Conv2dOpContext>("metal", "Conv2dOpContext")
      .def_pickle(
          [](const c10::intrusive_ptr<Conv2dOpContext>& self) -> Conv2dState {
            return self->state();
          },
          [](Conv2dState state) -> c10::intrusive_ptr<Conv2dOpContext> {
            return c10::make_intrusive<Conv2dOpContext>(std::move(state));
          });
  torch::class_<LinearOpContext>("metal", "LinearOpContext")
      .def_pickle(
          [](const c10::intrusive_ptr<LinearOpContext>& self) -> LinearState {
            return self->state();
          },
          [](LinearState state) -> c10::intrusive_ptr<LinearOpContext> {
            return c10::make_intrusive<LinearOpContext>(std::move(state));
          });

  def_library = std::make_unique<torch::Library>(
      torch::Library::DEF, "metal_prepack", std::nullopt, __FILE__, __LINE__);
  auto& m = *def_library;
  m.def(
      "metal_prepack::conv2d_prepack(Tensor W, Tensor? B, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups, "
      "Scalar? output_min=None, Scalar? output_max=None) "
      "-> __torch__.torch.classes.metal.Conv2dOpContext");
  m.def(
      "metal_prepack::conv2d_run(Tensor X, "
      "__torch__.torch.classes.metal.Conv2dOpContext W_prepack) -> Tensor Y");
  m.def(
      "metal_prepack::linear_prepack(Tensor W, Tensor? B, Scalar? output_min=None, "
      "Scalar? output_max=None) -> __torch__.torch.classes.metal.LinearOpContext");
  m.def(
      "metal_prepack::linear_run(Tensor X, "
      "__torch__.torch.classes.metal.LinearOpContext W_prepack) -> Tensor Y");

  cpu_library = std::make_unique<torch::Library>(
      torch::Library::IMPL, "metal_prepack", c10::DispatchKey::CPU, __FILE__, __LINE__);
  auto& cpu = *cpu_library;
  cpu.impl("conv2d_prepack", TORCH_FN(conv2d_prepack));
  cpu.impl("conv2d_run", TORCH_FN(conv2d_run));
  cpu.impl("linear_prepack", TORCH_FN(linear_prepack));
  cpu.impl("linear_run", TORCH_FN(linear_run));
}

std::optional<Provider> state;
std::mutex state_mutex;

} // namespace
} // namespace fxmobile::metal

namespace fxmobile {

Provider register_metal() {
  return register_once(metal::kNames, metal::state, metal::state_mutex, &metal::do_register);
}

} // namespace fxmobile
