// Memory-bound helpers of the kernels: a fused bias-add-and-clamp pass, an NCHW ->
// channels-last transpose and a bound check, all float32, all parallel over ATen's intra-op
// threads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fxmobile {

// data (rows x cols, row-major) = clamp(data + bias, lo, hi), one pass.
// With `bias_per_row`, row r adds bias[r % bias_len]; otherwise column c adds bias[c].
// `bias` may be null; lo/hi may be -inf/+inf. NaN propagates, and lo > hi yields hi, as in
// torch.clamp.
void add_bias_clamp_(
    float* data,
    int64_t rows,
    int64_t cols,
    const float* bias,
    bool bias_per_row,
    int64_t bias_len,
    float lo,
    float hi);

// t = clamp(t, lo, hi) in place, for a non-overlapping dense float32 tensor of any memory
// format (a no-op for lo = -inf, hi = +inf), with add_bias_clamp_'s semantics.
void clamp_dense_(at::Tensor& t, float lo, float hi);

// An NCHW float32 tensor copied to channels-last (blocked AVX transpose), parallel over
// ATen's threads.
at::Tensor to_channels_last(const at::Tensor& input);

// True when every element of the float32 tensor `t` has |x| <= limit: false for any NaN (and for
// any infinity, with a finite limit). One read of the tensor.
bool all_abs_at_most(const at::Tensor& t, float limit);

} // namespace fxmobile
