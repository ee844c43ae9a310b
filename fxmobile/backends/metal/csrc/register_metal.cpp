// The Metal op family: `metal_prepack::` operators and `metal.*OpContext` classes.
//
// Names, schemas and pickled state (a tuple of the prepack arguments) are those of upstream
// PyTorch (aten/src/ATen/native/metal/MetalPrepackOpRegister.cpp, MetalPrepackOpContext.h).
// Upstream's __setstate__ turns the stored weight into a channels-last 4-D tensor (and then
// pickles that one if saved again, which its own LinearOpContext __setstate__ then rejects);
// fxmobile keeps the weight exactly as prepacked, so every save pickles the original tuple.
#include "../../csrc/prepacked_context.h"
#include "../../csrc/registry.h"

namespace fxmobile::metal {
namespace {

// Metal accepts any clamp bounds, min > max included (torch.clamp semantics then).
class Conv2dOpContext : public PrepackedContext<Conv2dArgs, Conv2dKernel> {
 public:
  explicit Conv2dOpContext(State state)
      : PrepackedContext(std::move(state), [](const State& s) {
          return conv2d_kernel(
              s,
              ClampBounds::from_scalars(std::get<6>(s), std::get<7>(s)),
              "metal_prepack::conv2d_prepack",
              "metal_prepack::conv2d_run");
        }) {}
};

class LinearOpContext : public PrepackedContext<LinearArgs, LinearKernel> {
 public:
  explicit LinearOpContext(State state)
      : PrepackedContext(std::move(state), [](const State& s) {
          return linear_kernel(
              s,
              ClampBounds::from_scalars(std::get<2>(s), std::get<3>(s)),
              "metal_prepack::linear_prepack",
              "metal_prepack::linear_run");
        }) {}
};

void declare(Family& f) {
  f.context<Conv2dOpContext>("metal", "Conv2dOpContext");
  f.context<LinearOpContext>("metal", "LinearOpContext");

  f.op("metal_prepack::conv2d_prepack(Tensor W, Tensor? B, int[2] stride, "
       "int[2] padding, int[2] dilation, int groups, "
       "Scalar? output_min=None, Scalar? output_max=None) "
       "-> __torch__.torch.classes.metal.Conv2dOpContext",
       TORCH_FN(PrepackOp<Conv2dOpContext>::call));
  f.op("metal_prepack::conv2d_run(Tensor X, "
       "__torch__.torch.classes.metal.Conv2dOpContext W_prepack) -> Tensor Y",
       TORCH_FN(run_op<Conv2dOpContext>));
  f.op("metal_prepack::linear_prepack(Tensor W, Tensor? B, Scalar? output_min=None, "
       "Scalar? output_max=None) -> __torch__.torch.classes.metal.LinearOpContext",
       TORCH_FN(PrepackOp<LinearOpContext>::call));
  f.op("metal_prepack::linear_run(Tensor X, "
       "__torch__.torch.classes.metal.LinearOpContext W_prepack) -> Tensor Y",
       TORCH_FN(run_op<LinearOpContext>));
}

} // namespace
} // namespace fxmobile::metal

namespace fxmobile {

Provider register_metal() {
  static Family family("Metal", "metal_prepack", &metal::declare);
  return family.register_once();
}

} // namespace fxmobile
