#pragma once
// Differentiable views: they share the input's storage; the gradient is reshaped (or
// placed into zeros at the sliced rows) on the way back.
#include "core/tensor.h"

namespace ham {

Tensor reshape(const Tensor& x, const Shape& shape);           // one dim may be -1
Tensor slice_rows(const Tensor& x, int64_t begin, int64_t end);  // rows [begin, end) of dim 0

}  // namespace ham
