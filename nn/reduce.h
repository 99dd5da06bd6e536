#pragma once
// Differentiable sum and mean, over all elements (a 0-d result) or over one dim.
// A negative dim counts from the end; keepdim leaves the reduced dim as size 1.
//   sum:  dx = dy broadcast over the reduced elements
//   mean: dx = dy / n broadcast, n = number of reduced elements
#include "core/tensor.h"

namespace ham {

Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);

}  // namespace ham
