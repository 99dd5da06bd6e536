#pragma once
// Rotary position embedding, rotate-half convention. x [B, T, H, D], D even; for
// i < D/2 the pair (x_i, x_{i+D/2}) turns by angle a = pos * base^(-2i/D):
//   y_i       = x_i cos a - x_{i+D/2} sin a
//   y_{i+D/2} = x_{i+D/2} cos a + x_i sin a
// pos = positions[b, t] (i32/i64 [B, T], e.g. restarting at packed document starts) or
// t when positions is undefined. Angles, cos and sin are computed in double.
// Backward: a rotation is orthogonal, so dx = rotation of dy by -a.
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

HAM_DECLARE_KERNEL_TABLE(rope, void(const Tensor& x, double base, const Tensor& positions,
                                    Tensor& y));
HAM_DECLARE_KERNEL_TABLE(rope_backward, void(const Tensor& dy, double base,
                                             const Tensor& positions, Tensor& dx));

namespace ops {

Tensor rope(const Tensor& x, double base, const Tensor& positions = Tensor());
Tensor rope_backward(const Tensor& dy, double base, const Tensor& positions = Tensor());

}  // namespace ops

namespace cpu {
void rope(const Tensor& x, double base, const Tensor& positions, Tensor& y);
void rope_backward(const Tensor& dy, double base, const Tensor& positions, Tensor& dx);
}  // namespace cpu

}  // namespace ham
