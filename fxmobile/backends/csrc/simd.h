// What the hand-written float32 loops of the kernels share: multi-ISA compilation and the
// clamp with torch.clamp's semantics.
#pragma once

// The loops are memory-bound and vectorize well; on x86-64 Linux each function marked with
// this is compiled for AVX-512, AVX2 and the baseline, and the loader picks the best the CPU
// has.
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#define FXMOBILE_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FXMOBILE_SIMD_CLONES
#endif

namespace fxmobile {

inline __attribute__((always_inline)) float clamp_value(float v, float lo, float hi) {
  // Written so NaN passes through and lo > hi gives hi, like torch.clamp.
  v = v < lo ? lo : v;
  return hi < v ? hi : v;
}

} // namespace fxmobile
