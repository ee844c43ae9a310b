// Fused bias + clamp pass, the NCHW -> channels-last transpose and the bound check (see
// elementwise.h).
#include "elementwise.h"
#include "simd.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define FXMOBILE_HAVE_AVX_TRANSPOSE 1
#endif

namespace fxmobile {
namespace {

// Elements per parallel work chunk: below this, a thread costs more than it saves (and every
// parallel region is a chance to wait on a descheduled thread on a busy machine).
constexpr int64_t kGrainElements = 1 << 16;

// dst (hw x c, row stride ld) = transpose of src (c x hw, row-major), for pixels [p0, p1).
FXMOBILE_SIMD_CLONES
void transpose_pixels(
    const float* src,
    float* dst,
    int64_t c,
    int64_t hw,
    int64_t p0,
    int64_t p1,
    int64_t ld) {
  int64_t ch = 0;
#if defined(__SSE__)
  // 4x4 blocks: four loads along pixels, an in-register transpose, four stores along channels.
  for (; ch + 4 <= c; ch += 4) {
    const float* s = src + ch * hw;
    int64_t p = p0;
    for (; p + 4 <= p1; p += 4) {
      __m128 r0 = _mm_loadu_ps(s + p);
      __m128 r1 = _mm_loadu_ps(s + hw + p);
      __m128 r2 = _mm_loadu_ps(s + 2 * hw + p);
      __m128 r3 = _mm_loadu_ps(s + 3 * hw + p);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
      _mm_storeu_ps(dst + p * ld + ch, r0);
      _mm_storeu_ps(dst + (p + 1) * ld + ch, r1);
      _mm_storeu_ps(dst + (p + 2) * ld + ch, r2);
      _mm_storeu_ps(dst + (p + 3) * ld + ch, r3);
    }
    for (; p < p1; ++p) {
      for (int64_t k = 0; k < 4; ++k) {
        dst[p * ld + ch + k] = s[k * hw + p];
      }
    }
  }
#endif
  for (; ch < c; ++ch) {
    const float* s = src + ch * hw;
    for (int64_t p = p0; p < p1; ++p) {
      dst[p * ld + ch] = s[p];
    }
  }
}

#if defined(FXMOBILE_HAVE_AVX_TRANSPOSE)
// The same with 8x8 blocks in AVX registers, for CPUs that have AVX (checked at run time).
__attribute__((target("avx"))) void transpose_pixels_avx(
    const float* src,
    float* dst,
    int64_t c,
    int64_t hw,
    int64_t p0,
    int64_t p1,
    int64_t ld) {
  int64_t ch = 0;
  for (; ch + 8 <= c; ch += 8) {
    const float* s = src + ch * hw;
    int64_t p = p0;
    for (; p + 8 <= p1; p += 8) {
      __m256 r[8];
      for (int k = 0; k < 8; ++k) {
        r[k] = _mm256_loadu_ps(s + k * hw + p);
      }
      const __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]);
      const __m256 a1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 a2 = _mm256_unpacklo_ps(r[2], r[3]);
      const __m256 a3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 a4 = _mm256_unpacklo_ps(r[4], r[5]);
      const __m256 a5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 a6 = _mm256_unpacklo_ps(r[6], r[7]);
      const __m256 a7 = _mm256_unpackhi_ps(r[6], r[7]);
      const __m256 b0 = _mm256_shuffle_ps(a0, a2, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 b1 = _mm256_shuffle_ps(a0, a2, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 b2 = _mm256_shuffle_ps(a1, a3, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 b3 = _mm256_shuffle_ps(a1, a3, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 b4 = _mm256_shuffle_ps(a4, a6, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 b5 = _mm256_shuffle_ps(a4, a6, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 b6 = _mm256_shuffle_ps(a5, a7, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 b7 = _mm256_shuffle_ps(a5, a7, _MM_SHUFFLE(3, 2, 3, 2));
      _mm256_storeu_ps(dst + p * ld + ch, _mm256_permute2f128_ps(b0, b4, 0x20));
      _mm256_storeu_ps(dst + (p + 1) * ld + ch, _mm256_permute2f128_ps(b1, b5, 0x20));
      _mm256_storeu_ps(dst + (p + 2) * ld + ch, _mm256_permute2f128_ps(b2, b6, 0x20));
      _mm256_storeu_ps(dst + (p + 3) * ld + ch, _mm256_permute2f128_ps(b3, b7, 0x20));
      _mm256_storeu_ps(dst + (p + 4) * ld + ch, _mm256_permute2f128_ps(b0, b4, 0x31));
      _mm256_storeu_ps(dst + (p + 5) * ld + ch, _mm256_permute2f128_ps(b1, b5, 0x31));
      _mm256_storeu_ps(dst + (p + 6) * ld + ch, _mm256_permute2f128_ps(b2, b6, 0x31));
      _mm256_storeu_ps(dst + (p + 7) * ld + ch, _mm256_permute2f128_ps(b3, b7, 0x31));
    }
    for (; p < p1; ++p) {
      for (int64_t k = 0; k < 8; ++k) {
        dst[p * ld + ch + k] = s[k * hw + p];
      }
    }
  }
  if (ch < c) { // the last c % 8 channels
    transpose_pixels(src + ch * hw, dst + ch, c - ch, hw, p0, p1, ld);
  }
}
#endif

} // namespace

namespace {

FXMOBILE_SIMD_CLONES
void add_bias_clamp_rows(
    float* data,
    int64_t r0,
    int64_t r1,
    int64_t cols,
    int64_t ld,
    const float* bias,
    bool bias_per_row,
    int64_t bias_len,
    float lo,
    float hi) {
  for (int64_t r = r0; r < r1; ++r) {
    float* row = data + r * ld;
    if (bias == nullptr) {
      for (int64_t c = 0; c < cols; ++c) {
        row[c] = clamp_value(row[c], lo, hi);
      }
    } else if (bias_per_row) {
      const float b = bias[r % bias_len];
      for (int64_t c = 0; c < cols; ++c) {
        row[c] = clamp_value(row[c] + b, lo, hi);
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        row[c] = clamp_value(row[c] + bias[c], lo, hi);
      }
    }
  }
}

FXMOBILE_SIMD_CLONES
bool abs_at_most(const float* data, int64_t n, float limit) {
  int outside = 0; // an int, not a bool, so the loop vectorizes as an OR reduction
  for (int64_t i = 0; i < n; ++i) {
    outside |= !(std::fabs(data[i]) <= limit); // NaN compares false: outside
  }
  return outside == 0;
}

bool nothing_to_do(const float* bias, float lo, float hi) {
  return bias == nullptr && lo == -std::numeric_limits<float>::infinity() &&
      hi == std::numeric_limits<float>::infinity();
}

} // namespace

void add_bias_clamp_(
    float* data,
    int64_t rows,
    int64_t cols,
    const float* bias,
    bool bias_per_row,
    int64_t bias_len,
    float lo,
    float hi) {
  if (rows == 0 || cols == 0 || nothing_to_do(bias, lo, hi)) {
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kGrainElements / cols);
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    add_bias_clamp_rows(data, r0, r1, cols, cols, bias, bias_per_row, bias_len, lo, hi);
  });
}

void clamp_dense_(at::Tensor& t, float lo, float hi) {
  TORCH_INTERNAL_ASSERT(t.scalar_type() == at::kFloat && t.is_non_overlapping_and_dense());
  // Without a bias, any split of the numel() floats from data_ptr into rows will do.
  constexpr int64_t kCols = 1024;
  const int64_t n = t.numel();
  float* data = t.mutable_data_ptr<float>();
  add_bias_clamp_(data, n / kCols, kCols, nullptr, false, 1, lo, hi);
  add_bias_clamp_(data + n - n % kCols, 1, n % kCols, nullptr, false, 1, lo, hi);
}

at::Tensor to_channels_last(const at::Tensor& input) {
  TORCH_INTERNAL_ASSERT(input.dim() == 4 && input.is_contiguous());
  if (input.scalar_type() != at::kFloat) {
    return input.contiguous(at::MemoryFormat::ChannelsLast);
  }
  const int64_t n = input.size(0);
  const int64_t c = input.size(1);
  const int64_t hw = input.size(2) * input.size(3);
  at::Tensor out = at::empty(
      input.sizes(), input.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (input.numel() == 0) {
    return out;
  }
  const float* src = input.const_data_ptr<float>();
  float* dst = out.mutable_data_ptr<float>();

  // Work items are (image, tile of kPix pixels); a tile's destination rows (kPix * c floats)
  // and the source segments it reads stay in cache while it is copied.
  constexpr int64_t kPix = 64;
  const int64_t tiles = (hw + kPix - 1) / kPix;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / (kPix * c));
#if defined(FXMOBILE_HAVE_AVX_TRANSPOSE)
  static const bool avx = __builtin_cpu_supports("avx");
  const auto transpose = avx ? &transpose_pixels_avx : &transpose_pixels;
#else
  const auto transpose = &transpose_pixels;
#endif
  at::parallel_for(0, n * tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t img = t / tiles;
      const int64_t p0 = (t % tiles) * kPix;
      const int64_t p1 = std::min(hw, p0 + kPix);
      transpose(src + img * c * hw, dst + img * c * hw, c, hw, p0, p1, c);
    }
  });
  return out;
}

bool all_abs_at_most(const at::Tensor& t, float limit) {
  // A non-overlapping dense tensor (NCHW or channels-last) is its numel() floats from data_ptr.
  const at::Tensor dense = t.is_non_overlapping_and_dense() ? t : t.contiguous();
  const float* data = dense.const_data_ptr<float>();
  std::atomic<bool> within{true};
  at::parallel_for(0, dense.numel(), kGrainElements, [&](int64_t begin, int64_t end) {
    if (within.load(std::memory_order_relaxed) && !abs_at_most(data + begin, end - begin, limit)) {
      within.store(false, std::memory_order_relaxed);
    }
  });
  return within.load();
}

} // namespace fxmobile
