#pragma once
// Short causal depthwise 1-D convolution over time. x [B, T, C], weight [C, W], bias [C]
// (optional), doc_ids [B, T] i32/i64 (optional):
//   y[b, t, c] = bias[c] + sum_{j<W} weight[c, j] * x[b, t - (W-1) + j, c]
// where x counts as 0 before the start of t's document: a tap reading time s is dropped
// when s < start(b, t), start = the first t' <= t with doc_ids equal on [t', t] (0
// without doc_ids). A document starts wherever the id changes, as in the gated delta
// rule, so packed documents never see each other.
// Backward (s = t - (W-1) + j, only the taps the forward kept, i.e. s >= start(b, t)):
//   dx[b, s, c]    = sum_j weight[c, j] * dy[b, s + (W-1) - j, c]   (terms with t < T)
//   dweight[c, j]  = sum_{b,t} dy[b, t, c] * x[b, t - (W-1) + j, c]
//   dbias[c]       = sum_{b,t} dy[b, t, c]
// With Conv1dActivation::SiLU the op's output is z = silu(y) = y sigmoid(y) (the models'
// short convs), and its backward takes dz: y is recomputed from x, weight and bias (so
// nothing of the forward but x is kept) and dy = dz sigmoid(y) (1 + y (1 - sigmoid(y)))
// enters the formulas above. On a GPU that is one kernel each way instead of two.
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

enum class Conv1dActivation { None, SiLU };

HAM_DECLARE_KERNEL_TABLE(causal_conv1d, void(const Tensor& x, const Tensor& weight,
                                             const Tensor& bias, const Tensor& doc_ids,
                                             Conv1dActivation activation, Tensor& y));
// Fills each gradient that is defined on entry (an undefined one is not wanted). dy is the
// gradient of the op's output: of z where the activation is SiLU (bias is then read too).
HAM_DECLARE_KERNEL_TABLE(causal_conv1d_backward,
                         void(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, const Tensor& doc_ids,
                              Conv1dActivation activation, Tensor& dx, Tensor& dweight,
                              Tensor& dbias));

namespace ops {

struct CausalConv1dGrads {
  Tensor dx, dweight, dbias;
};

Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                     const Tensor& doc_ids = Tensor(),
                     Conv1dActivation activation = Conv1dActivation::None);
// bias matters only with an activation (the recomputed y includes it).
CausalConv1dGrads causal_conv1d_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                         bool want_dx, bool want_dweight, bool want_dbias,
                                         const Tensor& doc_ids = Tensor(),
                                         const Tensor& bias = Tensor(),
                                         Conv1dActivation activation = Conv1dActivation::None);

}  // namespace ops

namespace cpu {
void causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& doc_ids, Conv1dActivation activation, Tensor& y);
void causal_conv1d_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                            const Tensor& bias, const Tensor& doc_ids,
                            Conv1dActivation activation, Tensor& dx, Tensor& dweight,
                            Tensor& dbias);
}  // namespace cpu

}  // namespace ham
