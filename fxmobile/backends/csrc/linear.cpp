// The linear kernel (see linear.h).
#include "linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "elementwise.h"

namespace fxmobile {
namespace {

// A single-row linear with a weight at least this large splits its GEMV over the threads.
constexpr int64_t kParallelGemvMinWeight = 1 << 16;

} // namespace

LinearKernel::LinearKernel(
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    ClampBounds clamp,
    const char* prepack_op,
    const char* run_op)
    : op_(run_op), clamp_(clamp) {
  const char* op = prepack_op;
  TORCH_CHECK(
      weight.defined() && weight.dim() == 2,
      op,
      ": expected a 2-D weight (out_features, in_features), got ",
      weight.defined() ? shape_str(weight) : std::string("an undefined tensor"));
  TORCH_CHECK(
      weight.is_floating_point(),
      op,
      ": expected a floating-point weight, got ",
      weight.scalar_type());
  if (bias && bias->defined()) {
    TORCH_CHECK(
        bias->dim() == 1 && bias->size(0) == weight.size(0),
        op,
        ": expected a bias of shape [",
        weight.size(0),
        "], got ",
        shape_str(*bias));
    bias_ = bias->detach().contiguous();
  }
  weight_ = weight.detach().contiguous();
}

LinearKernel::Path LinearKernel::path_for(const at::Tensor& input) const {
  const bool fast =
      is_float_cpu(input) && is_float_cpu(weight_) && (!bias_ || is_float_cpu(*bias_));
  if (!fast) {
    return Path::kAten;
  }
  if (const int forced = forced_.load(std::memory_order_relaxed); forced != kNotForced) {
    return static_cast<Path>(forced);
  }
  return Path::kGemm;
}

const char* LinearKernel::path_name(Path path) {
  return path == Path::kAten ? "aten" : "gemm";
}

void LinearKernel::force_path(const std::string& name) const {
  if (name == "auto") {
    forced_.store(kNotForced);
  } else if (name == path_name(Path::kAten)) {
    forced_.store(static_cast<int>(Path::kAten));
  } else if (name == path_name(Path::kGemm)) {
    forced_.store(static_cast<int>(Path::kGemm));
  } else {
    TORCH_CHECK(
        false, op_, ": a linear layer cannot take the path '", name, "'; it can take 'auto', "
        "'aten', 'gemm'");
  }
}

void LinearKernel::check_input(const at::Tensor& input) const {
  TORCH_CHECK(
      input.dim() >= 1 && input.size(-1) == in_features(),
      op_,
      ": expected an input whose last dimension is in_features = ",
      in_features(),
      ", got shape ",
      shape_str(input));
}

const char* LinearKernel::path(const at::Tensor& input) const {
  check_input(input);
  return path_name(path_for(input));
}

at::Tensor LinearKernel::run(const at::Tensor& input) const {
  check_input(input);
  if (path_for(input) == Path::kAten) {
    const auto dtype = input.scalar_type();
    at::Tensor y = at::linear(
        input,
        weight_.to(dtype),
        bias_ ? std::optional<at::Tensor>(bias_->to(dtype)) : std::nullopt);
    clamp_.apply_(y);
    return y;
  }
  std::vector<int64_t> out_sizes(input.sizes().begin(), input.sizes().end() - 1);
  out_sizes.push_back(out_features());
  const at::Tensor x = input.reshape({-1, in_features()});
  const int64_t rows = x.size(0);
  const int64_t n = out_features();
  at::Tensor y = at::empty({rows, n}, input.options());
  if (rows == 1 && weight_.numel() >= kParallelGemvMinWeight && at::get_num_threads() > 1) {
    // One row is a GEMV, which BLAS runs on one thread; split the output features instead,
    // so each thread streams its own block of weight rows.
    const at::Tensor xv = x.select(0, 0);
    const at::Tensor yv = y.select(0, 0);
    const int64_t threads = at::get_num_threads();
    const int64_t grain = std::max<int64_t>(64, (n + threads - 1) / threads);
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
      at::Tensor out = yv.narrow(0, begin, end - begin);
      at::mv_out(out, weight_.narrow(0, begin, end - begin), xv);
    });
  } else {
    at::mm_out(y, x, weight_.t());
  }
  add_bias_clamp_(
      y.mutable_data_ptr<float>(), rows, n, bias_data(bias_), false, n, clamp_.lo(), clamp_.hi());
  return y.view(out_sizes);
}

} // namespace fxmobile
