// Which path a context's kernel takes, for tests and benchmarks: the `fxmobile::` debug ops.
//
//   fxmobile::kernel_path(Any context, Tensor input) -> str
//       the path a run of `context` on `input` takes ("onednn", "gemm", "aten", ...)
//   fxmobile::force_kernel_path(Any context, str path) -> ()
//       makes every float32 run of `context` take `path` ("auto": the kernel's own choice)
//
// They take the conv and linear contexts of all three families. The choice is derived state:
// it is never pickled (a loaded context chooses again), so saved files stay upstream's. These
// ops never appear in an optimized graph; mobile runtimes do not have them.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "registry.h"

namespace fxmobile {

// Implemented by every context whose kernel chooses between paths.
class KernelPaths {
 public:
  virtual ~KernelPaths() = default;
  virtual std::string kernel_path(const at::Tensor& input) const = 0;
  virtual void force_kernel_path(const std::string& path) const = 0;
};

Provider register_kernel_path_ops();

} // namespace fxmobile
