#pragma once
// Differentiable short causal depthwise conv over time: x [B, T, C], weight [C, W],
// bias [C] optional:
//   y[b, t, c] = bias[c] + sum_{j<W} weight[c, j] * x[b, t - (W-1) + j, c],  x = 0 for t < 0
// Gradients flow to x, weight and bias (formulas in core/ops/conv1d.h).
// Not yet: resetting the window at packed-document starts (a future optional doc_start
// argument after bias); today every sequence starts from zeros at t = 0 only.
#include "core/tensor.h"

namespace ham {

Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace ham
