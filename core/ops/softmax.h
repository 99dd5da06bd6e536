#pragma once
// Softmax over the last dim, max-subtracted:
//   softmax(x)_i     = exp(x_i - m) / s,       m = max_j x_j,  s = sum_j exp(x_j - m)
//   log_softmax(x)_i = x_i - m - log(s)
// Backward, from the saved output y:
//   softmax:     dx = y * (dy - sum_j dy_j y_j)
//   log_softmax: dx = dy - exp(y) * sum_j dy_j
// -inf inputs are masked entries: exp(-inf) = 0, they get zero gradient, and in
// log_softmax their (-inf) outputs add nothing to sum_j dy_j. A row that is all -inf
// gives softmax 0 and log_softmax -inf with zero gradient (no NaN). NaN stays in its row.
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

HAM_DECLARE_KERNEL_TABLE(softmax, void(const Tensor& x, Tensor& y));
HAM_DECLARE_KERNEL_TABLE(log_softmax, void(const Tensor& x, Tensor& y));
HAM_DECLARE_KERNEL_TABLE(softmax_backward, void(const Tensor& y, const Tensor& dy, Tensor& dx));
HAM_DECLARE_KERNEL_TABLE(log_softmax_backward,
                         void(const Tensor& y, const Tensor& dy, Tensor& dx));

namespace ops {

Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
Tensor softmax_backward(const Tensor& y, const Tensor& dy);
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy);

}  // namespace ops

namespace cpu {
void softmax(const Tensor& x, Tensor& y);
void log_softmax(const Tensor& x, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
}  // namespace cpu

}  // namespace ham
