#pragma once
// Differentiable dtype conversion (core/ops/cast.h):
//   y = cast(x, dtype);   dx = cast(dy, x's dtype)
// The gradient is converted back, so a bf16 activation computed from an f32 tensor sends
// an f32 gradient to it (rounded through bf16 on the way, as the forward was). x itself
// when it already has `dtype` (no node). Integer tensors carry no gradient.
#include "core/tensor.h"

namespace ham {

Tensor cast(const Tensor& x, DType dtype);

}  // namespace ham
