#pragma once
// Differentiable row normalizations over the last dim D (formulas in core/ops/norm.h).
//   rms_norm:       y = x / sqrt(mean(x^2) + eps) * weight
//   gated_rms_norm: y = rms_norm(x, weight) * silu(gate)   (Gated DeltaNet's output norm)
//   l2_norm:        y = x / sqrt(sum(x^2) + eps)           (FLA's convention)
// weight is [D] or an undefined Tensor() (no weight); gate has x's shape. Each op is one
// fused kernel forward and one backward that saves only the per-row 1/rms.
#include "core/tensor.h"

namespace ham {

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
Tensor gated_rms_norm(const Tensor& x, const Tensor& gate, const Tensor& weight,
                      double eps = 1e-6);
Tensor l2_norm(const Tensor& x, double eps = 1e-6);

}  // namespace ham
