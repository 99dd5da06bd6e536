#pragma once
// Short causal depthwise 1-D convolution over time. x [B, T, C], weight [C, W], bias [C]
// (optional):
//   y[b, t, c] = bias[c] + sum_{j<W} weight[c, j] * x[b, t - (W-1) + j, c],  x = 0 for t < 0
// Backward (s = t - (W-1) + j):
//   dx[b, s, c]    = sum_j weight[c, j] * dy[b, s + (W-1) - j, c]   (terms with t < T)
//   dweight[c, j]  = sum_{b,t} dy[b, t, c] * x[b, t - (W-1) + j, c]
//   dbias[c]       = sum_{b,t} dy[b, t, c]
// The window always starts from zeros; a per-document reset (an optional [B, T]
// doc_start mask zeroing taps that reach across a document start) is left for later and
// would be one more argument of both kernels.
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

HAM_DECLARE_KERNEL_TABLE(causal_conv1d, void(const Tensor& x, const Tensor& weight,
                                             const Tensor& bias, Tensor& y));
// Fills each gradient that is defined on entry (an undefined one is not wanted).
HAM_DECLARE_KERNEL_TABLE(causal_conv1d_backward,
                         void(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              Tensor& dx, Tensor& dweight, Tensor& dbias));

namespace ops {

struct CausalConv1dGrads {
  Tensor dx, dweight, dbias;
};

Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
CausalConv1dGrads causal_conv1d_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                         bool want_dx, bool want_dweight, bool want_dbias);

}  // namespace ops

namespace cpu {
void causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y);
void causal_conv1d_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, Tensor& dx,
                            Tensor& dweight, Tensor& dbias);
}  // namespace cpu

}  // namespace ham
