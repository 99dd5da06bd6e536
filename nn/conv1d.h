#pragma once
// Differentiable short causal depthwise conv over time: x [B, T, C], weight [C, W],
// bias [C] optional, doc_ids [B, T] i32/i64 optional:
//   y[b, t, c] = bias[c] + sum_{j<W} weight[c, j] * x[b, t - (W-1) + j, c]
// with x = 0 before t = 0 and before the start of t's document (a document starts
// wherever doc_ids changes), so the taps of a packed document never reach into the one
// before it. Gradients flow to x, weight and bias (formulas in core/ops/conv1d.h);
// doc_ids gets none. With Conv1dActivation::SiLU it returns silu(y) as one op, whose
// backward recomputes y from x: equal to silu(causal_conv1d(...)) without keeping y.
#include "core/ops/conv1d.h"
#include "core/tensor.h"

namespace ham {

Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                     const Tensor& doc_ids = Tensor(),
                     Conv1dActivation activation = Conv1dActivation::None);

}  // namespace ham
