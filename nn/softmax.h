#pragma once
// Differentiable softmax and log_softmax over the last dim (max-subtracted).
//   softmax:     dx = y * (dy - sum(dy * y))
//   log_softmax: dx = dy - exp(y) * sum(dy)
// -inf entries are masked: they get probability 0 (log-prob -inf) and zero gradient. A
// row with no finite entry gives softmax 0 / log_softmax -inf and zero gradient rather
// than NaN, and never affects other rows. See core/ops/softmax.h.
#include "core/tensor.h"

namespace ham {

Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);

}  // namespace ham
