#pragma once
// Sum and mean over one dim or over all elements.
// The input is viewed as [outer, len, inner] with `len` the reduced dim:
//   out[o, i] = scale * sum_l in[o, l, i]     (scale = 1 for sum, 1 / len for mean)
// and the backward spreads the gradient back over the reduced dim:
//   dx[o, l, i] = scale * dy[o, i]
// The CPU kernel accumulates in f64 in a fixed order, so results do not depend on the
// thread count.
#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

struct ReduceDims {
  int64_t outer = 1, len = 1, inner = 1;
};

HAM_DECLARE_KERNEL_TABLE(reduce_sum,
                         void(const Tensor& in, Tensor& out, const ReduceDims&, double scale));
HAM_DECLARE_KERNEL_TABLE(reduce_sum_backward,
                         void(const Tensor& dy, Tensor& dx, const ReduceDims&, double scale));

namespace ops {

// [outer, len, inner] for reducing `dim` of `shape` (dim already normalized by
// ops::normalize_dim from core/ops/shape.h).
ReduceDims reduce_dims(const Shape& shape, int64_t dim);
// `shape` with `dim` removed (or set to 1 with keepdim).
Shape reduced_shape(const Shape& shape, int64_t dim, bool keepdim);

Tensor sum(const Tensor& x);  // 0-d
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x);  // 0-d
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);

// out = scale * (in reduced as `dims` say), shaped `out_shape`.
Tensor reduce_sum(const char* op, const Tensor& x, const ReduceDims& dims, double scale,
                  const Shape& out_shape);
// dx of shape `input_shape` with dx[o, l, i] = scale * dy[o, i].
Tensor reduce_sum_backward(const Tensor& dy, const Shape& input_shape, const ReduceDims& dims,
                           double scale);

}  // namespace ops

namespace cpu {
void reduce_sum(const Tensor& in, Tensor& out, const ReduceDims& dims, double scale);
void reduce_sum_backward(const Tensor& dy, Tensor& dx, const ReduceDims& dims, double scale);
}  // namespace cpu

}  // namespace ham
