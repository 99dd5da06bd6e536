#pragma once
// Differentiable element-wise unary ops, y = f(x), dx = dy * f'(x):
//   exp      f' = y                    log     f' = 1 / x
//   sigmoid  f' = y (1 - y)            silu    f' = s (1 + x (1 - s)),  s = sigmoid(x)
//   softplus f' = sigmoid(x)           gelu    f' = Phi(x) + x phi(x)   (exact erf form)
//   tanh     f' = 1 - y^2              neg     f' = -1
//   square   f' = 2 x                  sqrt    f' = 1 / (2 y)
//   relu     f' = [x > 0]
// softplus is max(x, 0) + log1p(e^-|x|) and sigmoid never evaluates e^t for t > 0, so
// both stay finite for any finite x.
#include "core/tensor.h"

namespace ham {

Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor softplus(const Tensor& x);
Tensor gelu(const Tensor& x);  // 0.5 x (1 + erf(x / sqrt 2))
Tensor tanh(const Tensor& x);
Tensor neg(const Tensor& x);
Tensor square(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor relu(const Tensor& x);

}  // namespace ham
