// Memory-bound helpers of the kernels: a fused bias-add-and-clamp pass and an NCHW ->
// channels-last transpose, both float32, both parallel over ATen's intra-op threads.
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

// An NCHW float32 tensor copied to channels-last (blocked AVX transpose), parallel over
// ATen's threads.
at::Tensor to_channels_last(const at::Tensor& input);

} // namespace fxmobile
