#pragma once
// Row normalizations over the last dim D of x, viewed as [rows, D].
//
// rms_norm, with an optional weight [D] and an optional gate (x's shape):
//   rstd = 1 / sqrt(mean(x^2) + eps),  xhat = x rstd,  n = xhat weight
//   y = n silu(gate)                    (y = n without a gate)
// backward, with g = dy silu(gate) weight:
//   dx      = rstd (g - xhat mean(g xhat))
//   dgate   = dy n silu'(gate),         silu'(z) = s (1 + z (1 - s)),  s = sigmoid(z)
//   dweight = sum over rows of dy silu(gate) xhat
//
// l2_norm (FLA's convention, eps inside the root):
//   rstd = 1 / sqrt(sum(x^2) + eps),  y = x rstd
//   dx = rstd (dy - x rstd^2 sum(dy x))
//
// rstd ([rows], x's dtype) is the one thing the forward saves for the backward. The CPU
// kernels accumulate row sums in f64 and sum dweight over rows in a fixed order.
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

// gate and weight may be undefined.
HAM_DECLARE_KERNEL_TABLE(rms_norm, void(const Tensor& x, const Tensor& gate, const Tensor& weight,
                                        double eps, Tensor& y, Tensor& rstd));
// dx, dgate and dweight may be undefined: that gradient is not computed.
HAM_DECLARE_KERNEL_TABLE(rms_norm_backward,
                         void(const Tensor& dy, const Tensor& x, const Tensor& gate,
                              const Tensor& weight, const Tensor& rstd, Tensor& dx,
                              Tensor& dgate, Tensor& dweight));
HAM_DECLARE_KERNEL_TABLE(l2_norm, void(const Tensor& x, double eps, Tensor& y, Tensor& rstd));
HAM_DECLARE_KERNEL_TABLE(l2_norm_backward,
                         void(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dx));

namespace ops {

struct NormResult {
  Tensor y, rstd;
};
struct RmsNormGrads {
  Tensor dx, dgate, dweight;
};

// `op` names the caller in errors ("rms_norm", "gated_rms_norm").
NormResult rms_norm(const char* op, const Tensor& x, const Tensor& gate, const Tensor& weight,
                    double eps);
RmsNormGrads rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gate,
                               const Tensor& weight, const Tensor& rstd, bool want_dx,
                               bool want_dgate, bool want_dweight);
NormResult l2_norm(const Tensor& x, double eps);
Tensor l2_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& rstd);

}  // namespace ops

namespace cpu {
void rms_norm(const Tensor& x, const Tensor& gate, const Tensor& weight, double eps, Tensor& y,
              Tensor& rstd);
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gate,
                       const Tensor& weight, const Tensor& rstd, Tensor& dx, Tensor& dgate,
                       Tensor& dweight);
void l2_norm(const Tensor& x, double eps, Tensor& y, Tensor& rstd);
void l2_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dx);
}  // namespace cpu

}  // namespace ham
