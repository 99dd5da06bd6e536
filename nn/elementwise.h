#pragma once
// Differentiable element-wise binary ops with broadcasting.
//   add: dA = sum_to(dY), dB = sum_to(dY)       sub: dB = -sum_to(dY)
//   mul: dA = sum_to(dY * B), dB = sum_to(dY * A)
//   div: dA = sum_to(dY / B), dB = -sum_to(dY * A / B^2)
// sum_to reduces over the dims broadcasting stretched.
#include "core/tensor.h"

namespace ham {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

// x * alpha for a constant alpha (no gradient to alpha).
Tensor scale(const Tensor& x, double alpha);
// x + c for a constant c.
Tensor add_scalar(const Tensor& x, double c);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator*(const Tensor& a, double s) { return scale(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return scale(a, s); }

}  // namespace ham
