// 1x1 convolution as a GEMM (see conv_gemm.h).
#include "conv_gemm.h"

#include <ATen/ATen.h>
#include <c10/util/irange.h>

#include "elementwise.h"

namespace fxmobile {

bool GemmConv::applies(const at::Tensor& weight, const ConvGeometry& geo) {
  return !geo.transposed && geo.groups == 1 && weight.size(2) == 1 && weight.size(3) == 1 &&
      geo.stride == std::vector<int64_t>{1, 1} && geo.padding == std::vector<int64_t>{0, 0};
}

GemmConv::GemmConv(
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    ClampBounds clamp)
    : w_(weight.view({weight.size(0), weight.size(1)})),
      wt_(w_.t().contiguous()),
      bias_(bias),
      clamp_(clamp) {}

at::Tensor GemmConv::run(const at::Tensor& input) const {
  const int64_t n = input.size(0);
  const int64_t cin = input.size(1);
  const int64_t h = input.size(2);
  const int64_t w = input.size(3);
  const int64_t cout = w_.size(0);
  const float lo = clamp_.lo();
  const float hi = clamp_.hi();
  if (input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    // Channels-last: the pixels are the rows, Y (NHW x Cout) = X (NHW x Cin) W^T.
    const at::Tensor x = input.permute({0, 2, 3, 1}).reshape({n * h * w, cin});
    at::Tensor y = at::empty({n * h * w, cout}, input.options());
    at::mm_out(y, x, wt_);
    add_bias_clamp_(
        y.mutable_data_ptr<float>(), n * h * w, cout, bias_data(bias_), false, cout, lo, hi);
    return y.view({n, h, w, cout}).permute({0, 3, 1, 2});
  }
  // NCHW: per image, Y (Cout x HW) = W (Cout x Cin) X (Cin x HW). (Cutting it into per-thread
  // tiles with the bias-and-clamp pass on cache-hot tiles measured slower than BLAS's own
  // threading followed by one pass.)
  const at::Tensor x = input.contiguous().view({n, cin, h * w});
  at::Tensor y = at::empty({n, cout, h, w}, input.options());
  const at::Tensor y3 = y.view({n, cout, h * w});
  for (const auto i : c10::irange(n)) {
    at::Tensor yi = y3.select(0, i);
    at::mm_out(yi, w_, x.select(0, i));
  }
  add_bias_clamp_(
      y.mutable_data_ptr<float>(), n * cout, h * w, bias_data(bias_), true, cout, lo, hi);
  return y;
}

} // namespace fxmobile
