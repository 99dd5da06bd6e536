#pragma once
// Differentiable layout ops (all copies; see core/ops/shape.h for the index math).
//   concat:  dx_i = the slice of dY that x_i filled         (= split of dY)
//   split:   dX = concat of the outputs' gradients (zeros for an unused output)
//   permute: dX = permute(dY, inverse(dims));  transpose swaps two dims
//   gather / index_select: dX = zeros with dY scatter-added at the index (repeats sum)
// Negative dims count from the end. Index tensors are i32/i64 and get no gradient.
#include <vector>

#include "core/tensor.h"

namespace ham {

Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
// torch.gather: index has x's rank, is no larger than x outside `dim`; out has index's shape.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// 1-D index: out = x with dim `dim` replaced by the rows index picks.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);

}  // namespace ham
