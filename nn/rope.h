#pragma once
// Differentiable rotary position embedding (rotate-half convention), x [B, T, H, D],
// D even. For i < D/2, (x_i, x_{i+D/2}) turns by a = pos * base^(-2i/D):
//   y_i = x_i cos a - x_{i+D/2} sin a,   y_{i+D/2} = x_{i+D/2} cos a + x_i sin a
// positions: optional [B, T] i32/i64 (packed documents restart at 0); default pos = t.
// Backward: dx = dy rotated by -a.
#include "core/tensor.h"

namespace ham {

Tensor rope(const Tensor& x, double base, const Tensor& positions = Tensor());

}  // namespace ham
