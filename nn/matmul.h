#pragma once
// Differentiable matrix products.
//   Y = op(A) op(B):  dA = dY op(B)^T (transposed back when trans_a), dB likewise.
//   linear(x, W, b) = x W^T + b with W [out, in] (the PyTorch layout).
#include "core/tensor.h"

namespace ham {

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace ham
