// CPU kernels shared by the XNNPACK, Vulkan and Metal op families of fxmobile._C.
//
// Each prepacked op context owns one of these kernels. The kernel does the input-independent
// work once, when the context is created (or unpickled), so that a run does less than the
// eager ops it replaces (conv2d / linear, then a separate clamp):
//   * convolution (conv2d.h): by the input's layout and size, oneDNN with the weight reordered
//     once, the bias fused and the clamp fused where that keeps NaN (conv_onednn.h), a 1x1
//     convolution as one GEMM plus a fused bias-and-clamp pass (conv_gemm.h), fxmobile's direct
//     depthwise loop on small maps (depthwise.h), or ATen's convolution for everything else;
//   * linear (linear.h): one GEMM (a GEMV split over the threads for a single row) and the
//     same fused bias-and-clamp pass.
// Shared by all of them: clamp bounds and convolution geometry (params.h), and the
// memory-bound passes (elementwise.h).
// The contexts keep the original tensors as their pickled state; kernels are rebuilt from that
// state on load, so nothing here ever reaches a saved file.
#pragma once

#include "conv2d.h"
#include "linear.h"
#include "params.h"
