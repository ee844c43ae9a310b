// The fxmobile:: debug ops (see kernel_paths.h).
#include "kernel_paths.h"

#include <ATen/core/ivalue.h>

namespace fxmobile {
namespace {

// The context's own object keeps the returned holder alive while it is used.
c10::intrusive_ptr<torch::CustomClassHolder> holder_of(const c10::IValue& context, const char* op) {
  TORCH_CHECK(
      context.isCustomClass(),
      op,
      ": expected a prepacked conv or linear context, got a value of type ",
      context.type()->str());
  return context.toObjectRef().getSlot(0).toCapsule();
}

const KernelPaths& paths_of(
    const c10::intrusive_ptr<torch::CustomClassHolder>& holder,
    const c10::IValue& context,
    const char* op) {
  const auto* paths = dynamic_cast<const KernelPaths*>(holder.get());
  TORCH_CHECK(
      paths != nullptr,
      op,
      ": ",
      context.type()->str(),
      " has no choice of kernel path (only fxmobile's conv and linear contexts have one; a "
      "context from torch's own backend has its own kernels)");
  return *paths;
}

std::string kernel_path(const c10::IValue& context, const at::Tensor& input) {
  const char* op = "fxmobile::kernel_path";
  const auto holder = holder_of(context, op);
  return paths_of(holder, context, op).kernel_path(input);
}

void force_kernel_path(const c10::IValue& context, const std::string& path) {
  const char* op = "fxmobile::force_kernel_path";
  const auto holder = holder_of(context, op);
  paths_of(holder, context, op).force_kernel_path(path);
}

void declare(Family& f) {
  f.op_for_any_device(
      "fxmobile::kernel_path(Any context, Tensor input) -> str", &kernel_path);
  f.op_for_any_device(
      "fxmobile::force_kernel_path(Any context, str path) -> ()", &force_kernel_path);
}

} // namespace

Provider register_kernel_path_ops() {
  static Family family("fxmobile debug", "fxmobile", &declare);
  return family.register_once();
}

} // namespace fxmobile
