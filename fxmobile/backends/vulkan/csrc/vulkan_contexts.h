// The `vulkan.*PackedContext` classes of the Vulkan op family, with CPU kernels.
//
// Upstream (aten/src/ATen/native/vulkan/ops/{Convolution,Mm,Layernorm,Batchnorm,Gru,Lstm}.h)
// keeps, next to the GPU-packed data, the "unpacked" list of the create_*_context arguments,
// and pickles that list: __getstate__ returns it, __setstate__ packs it again. These classes
// keep the same list, element for element (their `state()`, see ../../csrc/registry.h), and
// pack it for fxmobile's CPU kernels instead of a GPU. One deliberate difference, for
// Gru/LstmPackedContext: upstream's __getstate__ returns the weights split per gate (12 or 16
// tensors per layer), which upstream's own __setstate__ rejects (it wants 4 per layer), so a
// saved upstream GRU/LSTM context cannot be loaded back. fxmobile pickles the 4-per-layer list
// that create_*_context received, which every runtime loads, and accepts both forms when
// loading.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/custom_class.h>

#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "../../csrc/kernel_paths.h"
#include "../../csrc/kernels.h"

namespace fxmobile::vulkan {

using List = c10::impl::GenericList;

// Element order of each class's unpacked list; the names follow upstream's Unpacked/ListArgs.
namespace conv2d_args {
enum : size_t {
  kWeight,
  kBias,
  kStride,
  kPadding,
  kDilation,
  kTransposed,
  kQuantized,
  kOutputPadding,
  kGroups,
  kOutputMin,
  kOutputMax,
  kNumArgs
};
}
namespace conv1d_args {
enum : size_t { kWeight, kBias, kStride, kPadding, kDilation, kGroups, kNumArgs };
}
namespace linear_args {
enum : size_t { kWeight, kBias, kNumArgs };
}
namespace layernorm_args {
enum : size_t { kWeight, kBias, kEps, kNumArgs };
}
namespace batchnorm_args {
enum : size_t { kWeight, kBias, kRunningMean, kRunningVar, kEps, kNumArgs };
}
namespace rnn_args {
enum : size_t {
  kParams,
  kHasBiases,
  kNumLayers,
  kDropout,
  kTrain,
  kBidirectional,
  kBatchFirst,
  kNumArgs
};
}

// Used for both create_conv2d_context and create_tconv2d_context (the list says which).
class Conv2dPackedContext : public torch::CustomClassHolder, public KernelPaths {
 public:
  explicit Conv2dPackedContext(List unpacked);
  using State = List;
  const List& state() const {
    return unpacked_;
  }
  at::Tensor run(const at::Tensor& input) const {
    return kernel_->run(input);
  }
  std::string kernel_path(const at::Tensor& input) const override {
    return kernel_->path(input);
  }
  void force_kernel_path(const std::string& path) const override {
    kernel_->force_path(path);
  }

 private:
  List unpacked_;
  std::unique_ptr<Conv2dKernel> kernel_;
};

class Conv1dPackedContext : public torch::CustomClassHolder, public KernelPaths {
 public:
  explicit Conv1dPackedContext(List unpacked);
  using State = List;
  const List& state() const {
    return unpacked_;
  }
  at::Tensor run(const at::Tensor& input) const;
  std::string kernel_path(const at::Tensor& input) const override;
  void force_kernel_path(const std::string& path) const override {
    kernel_->force_path(path);
  }

 private:
  List unpacked_;
  std::unique_ptr<Conv2dKernel> kernel_; // the 1-D convolution as a 1 x L 2-D one
};

// The weight in the list is already transposed, (in_features, out_features): upstream's
// rewrite inserts aten::t before create_linear_context.
class LinearPackedContext : public torch::CustomClassHolder, public KernelPaths {
 public:
  explicit LinearPackedContext(List unpacked);
  using State = List;
  const List& state() const {
    return unpacked_;
  }
  at::Tensor run(const at::Tensor& input) const {
    return kernel_->run(input);
  }
  std::string kernel_path(const at::Tensor& input) const override {
    return kernel_->path(input);
  }
  void force_kernel_path(const std::string& path) const override {
    kernel_->force_path(path);
  }

 private:
  List unpacked_;
  std::unique_ptr<LinearKernel> kernel_;
};

class LayernormPackedContext : public torch::CustomClassHolder {
 public:
  explicit LayernormPackedContext(List unpacked);
  using State = List;
  const List& state() const {
    return unpacked_;
  }
  at::Tensor run(const at::Tensor& input, c10::IntArrayRef normalized_shape) const;

 private:
  List unpacked_;
  at::Tensor weight_;
  at::Tensor bias_;
  double eps_;
};

class BatchNormPackedContext : public torch::CustomClassHolder {
 public:
  explicit BatchNormPackedContext(List unpacked);
  using State = List;
  const List& state() const {
    return unpacked_;
  }
  at::Tensor run(const at::Tensor& input) const;

 private:
  List unpacked_;
  at::Tensor weight_;
  at::Tensor bias_;
  at::Tensor running_mean_;
  at::Tensor running_var_;
  double eps_;
};

// GRU and LSTM share the list layout and the restrictions of upstream's Vulkan kernels:
// biases, inference, one direction, no dropout, batch-first input.
class RnnPackedContext : public torch::CustomClassHolder {
 public:
  enum class Kind { kGru, kLstm };
  RnnPackedContext(List unpacked, Kind kind);
  using State = List;
  const List& state() const {
    return unpacked_;
  }

 protected:
  void check_input(const at::Tensor& input, const char* op) const;

  List unpacked_;
  Kind kind_;
  std::vector<at::Tensor> params_; // 4 per layer: w_ih, w_hh, b_ih, b_hh
  int64_t num_layers_;
  bool batch_first_;
};

class GruPackedContext : public RnnPackedContext {
 public:
  explicit GruPackedContext(List unpacked) : RnnPackedContext(std::move(unpacked), Kind::kGru) {}
  std::tuple<at::Tensor, at::Tensor> run(const at::Tensor& input, const at::Tensor& hx) const;
};

class LstmPackedContext : public RnnPackedContext {
 public:
  explicit LstmPackedContext(List unpacked)
      : RnnPackedContext(std::move(unpacked), Kind::kLstm) {}
  std::tuple<at::Tensor, at::Tensor, at::Tensor> run(
      const at::Tensor& input,
      const at::Tensor& hx,
      const at::Tensor& cx) const;
};

} // namespace fxmobile::vulkan
