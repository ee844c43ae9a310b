// Direct channels-last depthwise convolution (see depthwise.h).
#include "depthwise.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "elementwise.h"
#include "simd.h"

namespace fxmobile {
namespace {

// Channels per register block: one AVX-512 register, two AVX2 ones.
constexpr int64_t kBlock = 16;
// Multiply-adds per parallel chunk: below this a second thread costs more than it saves.
constexpr int64_t kGrainMacs = 1 << 17;

struct Plane {
  const float* in; // one image, (H, W, C)
  float* out; // one image, (OH, OW, C)
  int64_t h, w, c, out_w;
};

// 16 floats as one value: one AVX-512 register, two AVX2 ones, four SSE ones (GCC vector
// extension, so each target_clones variant gets its own instructions).
typedef float Vec16 __attribute__((vector_size(kBlock * sizeof(float))));

inline __attribute__((always_inline)) Vec16 load16(const float* p) {
  Vec16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

inline __attribute__((always_inline)) void store16(float* p, Vec16 v) {
  __builtin_memcpy(p, &v, sizeof(v));
}

// One output pixel, channels [c0, c0 + kBlock): the bias, plus each tap inside the image.
inline __attribute__((always_inline)) void pixel_block(
    const Plane& p,
    const float* taps,
    const Vec16& bias,
    const DepthwiseGeometry& g,
    int64_t ih0,
    int64_t iw0,
    int64_t c0,
    float* dst,
    const Vec16& lo,
    const Vec16& hi) {
  Vec16 acc = bias;
  for (int64_t kh = 0; kh < g.kernel_h; ++kh) {
    const int64_t ih = ih0 + kh * g.dilation_h;
    if (ih < 0 || ih >= p.h) {
      continue;
    }
    const float* x_row = p.in + ih * p.w * p.c + c0;
    const float* k_row = taps + kh * g.kernel_w * p.c + c0;
    for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
      const int64_t iw = iw0 + kw * g.dilation_w;
      if (iw >= 0 && iw < p.w) {
        acc += load16(x_row + iw * p.c) * load16(k_row + kw * p.c);
      }
    }
  }
  acc = acc < lo ? lo : acc; // NaN stays NaN, lo > hi gives hi: torch.clamp
  acc = hi < acc ? hi : acc;
  store16(dst, acc);
}

// The last `len` < kBlock channels of one output pixel, one at a time.
inline __attribute__((always_inline)) void pixel_tail(
    const Plane& p,
    const float* taps,
    const float* bias,
    const DepthwiseGeometry& g,
    int64_t ih0,
    int64_t iw0,
    int64_t c0,
    float* dst,
    float lo,
    float hi) {
  for (int64_t c = c0; c < p.c; ++c) {
    float acc = bias != nullptr ? bias[c] : 0.0f;
    for (int64_t kh = 0; kh < g.kernel_h; ++kh) {
      const int64_t ih = ih0 + kh * g.dilation_h;
      if (ih < 0 || ih >= p.h) {
        continue;
      }
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const int64_t iw = iw0 + kw * g.dilation_w;
        if (iw >= 0 && iw < p.w) {
          acc += p.in[(ih * p.w + iw) * p.c + c] * taps[(kh * g.kernel_w + kw) * p.c + c];
        }
      }
    }
    dst[c - c0] = clamp_value(acc, lo, hi);
  }
}

// Output rows [r0, r1) of one image.
FXMOBILE_SIMD_CLONES
void depthwise_rows(
    const Plane& p,
    const float* taps,
    const float* bias,
    const DepthwiseGeometry& g,
    int64_t r0,
    int64_t r1,
    float lo,
    float hi) {
  const int64_t full = p.c - p.c % kBlock;
  Vec16 lo_v, hi_v;
  for (int64_t j = 0; j < kBlock; ++j) {
    lo_v[j] = lo;
    hi_v[j] = hi;
  }
  for (int64_t oh = r0; oh < r1; ++oh) {
    const int64_t ih0 = oh * g.stride_h - g.pad_h;
    for (int64_t ow = 0; ow < p.out_w; ++ow) {
      const int64_t iw0 = ow * g.stride_w - g.pad_w;
      float* dst = p.out + (oh * p.out_w + ow) * p.c;
      for (int64_t c0 = 0; c0 < full; c0 += kBlock) {
        const Vec16 b = bias != nullptr ? load16(bias + c0) : Vec16{};
        pixel_block(p, taps, b, g, ih0, iw0, c0, dst + c0, lo_v, hi_v);
      }
      if (full < p.c) {
        pixel_tail(p, taps, bias, g, ih0, iw0, full, dst + full, lo, hi);
      }
    }
  }
}

} // namespace

at::Tensor depthwise_taps_major(const at::Tensor& weight) {
  // (C, 1, KH, KW) -> (KH, KW, C) -> (KH * KW, C)
  return weight.squeeze(1).permute({1, 2, 0}).contiguous().view({-1, weight.size(0)});
}

at::Tensor depthwise_nhwc(
    const at::Tensor& input,
    const at::Tensor& taps,
    const float* bias,
    const DepthwiseGeometry& g,
    float lo,
    float hi) {
  const int64_t n = input.size(0);
  const int64_t c = input.size(1);
  const int64_t h = input.size(2);
  const int64_t w = input.size(3);
  const int64_t span_h = g.dilation_h * (g.kernel_h - 1) + 1;
  const int64_t span_w = g.dilation_w * (g.kernel_w - 1) + 1;
  const int64_t out_h = (h + 2 * g.pad_h - span_h) / g.stride_h + 1;
  const int64_t out_w = (w + 2 * g.pad_w - span_w) / g.stride_w + 1;
  at::Tensor out = at::empty(
      {n, c, out_h, out_w}, input.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) {
    return out;
  }
  const float* in = input.const_data_ptr<float>();
  float* dst = out.mutable_data_ptr<float>();
  const float* k = taps.const_data_ptr<float>();
  const int64_t macs_per_row = out_w * c * g.kernel_h * g.kernel_w;
  const int64_t grain = std::max<int64_t>(1, kGrainMacs / std::max<int64_t>(1, macs_per_row));
  // Rows of all images form one range, so a batch of small images still splits.
  at::parallel_for(0, n * out_h, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end;) {
      const int64_t image = row / out_h;
      const int64_t last = std::min(end, (image + 1) * out_h);
      const Plane p{in + image * h * w * c, dst + image * out_h * out_w * c, h, w, c, out_w};
      depthwise_rows(p, k, bias, g, row - image * out_h, last - image * out_h, lo, hi);
      row = last;
    }
  });
  return out;
}

bool DepthwiseConv::applies(const at::Tensor& weight, const ConvGeometry& geo) {
  return !geo.transposed && geo.groups > 1 && weight.size(1) == 1 && weight.size(0) == geo.groups;
}

DepthwiseConv::DepthwiseConv(
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    const ConvGeometry& geometry,
    ClampBounds clamp)
    : taps_(depthwise_taps_major(weight)),
      bias_(bias),
      geo_{
          weight.size(2),
          weight.size(3),
          geometry.stride[0],
          geometry.stride[1],
          geometry.padding[0],
          geometry.padding[1],
          geometry.dilation[0],
          geometry.dilation[1]},
      clamp_(clamp) {}

at::Tensor DepthwiseConv::run(const at::Tensor& input) const {
  at::Tensor x = input;
  if (!x.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    x = x.is_contiguous() ? to_channels_last(x) : x.contiguous(at::MemoryFormat::ChannelsLast);
  }
  return depthwise_nhwc(x, taps_, bias_data(bias_), geo_, clamp_.lo(), clamp_.hi());
}

} // namespace fxmobile
