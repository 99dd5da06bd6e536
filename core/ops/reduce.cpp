#include <cstdint>

#include "core/ops/reduce.h"

#include "core/ops/shape.h"

namespace ham {

HAM_DEFINE_KERNEL_TABLE(reduce_sum, &cpu::reduce_sum,
                        void(const Tensor& in, Tensor& out, const ReduceDims&, double scale))
HAM_DEFINE_KERNEL_TABLE(reduce_sum_backward, &cpu::reduce_sum_backward,
                        void(const Tensor& dy, Tensor& dx, const ReduceDims&, double scale))

namespace ops {

ReduceDims reduce_dims(const Shape& shape, int64_t dim) {
  ReduceDims dims;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d) {
    if (d < dim) dims.outer *= shape[size_t(d)];
    else if (d == dim) dims.len = shape[size_t(d)];
    else dims.inner *= shape[size_t(d)];
  }
  return dims;
}

Shape reduced_shape(const Shape& shape, int64_t dim, bool keepdim) {
  Shape out = shape;
  if (keepdim) out[size_t(dim)] = 1;
  else out.erase(out.begin() + dim);
  return out;
}

Tensor reduce_sum(const char* op, const Tensor& x, const ReduceDims& dims, double scale,
                  const Shape& out_shape) {
  HAM_CHECK(is_floating(x.dtype()), op, ": input must be floating point, got ", x.str());
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  reduce_sum_kernels()(x.device(), x, out, dims, scale);
  return out;
}

Tensor reduce_sum_backward(const Tensor& dy, const Shape& input_shape, const ReduceDims& dims,
                           double scale) {
  HAM_CHECK(dy.numel() == dims.outer * dims.inner, "sum backward: gradient ", dy.str(),
            " does not match input ", shape_str(input_shape));
  Tensor dx = Tensor::empty(input_shape, dy.dtype(), dy.device());
  reduce_sum_backward_kernels()(dy.device(), dy, dx, dims, scale);
  return dx;
}

namespace {

ReduceDims all_elements(const Tensor& x) { return ReduceDims{1, x.numel(), 1}; }

}  // namespace

Tensor sum(const Tensor& x) { return reduce_sum("sum", x, all_elements(x), 1.0, {}); }

Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  dim = normalize_dim("sum", dim, x.shape());
  return reduce_sum("sum", x, reduce_dims(x.shape(), dim), 1.0,
                    reduced_shape(x.shape(), dim, keepdim));
}

Tensor mean(const Tensor& x) {
  return reduce_sum("mean", x, all_elements(x), 1.0 / double(x.numel()), {});
}

Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  dim = normalize_dim("mean", dim, x.shape());
  ReduceDims dims = reduce_dims(x.shape(), dim);
  return reduce_sum("mean", x, dims, 1.0 / double(dims.len),
                    reduced_shape(x.shape(), dim, keepdim));
}

}  // namespace ops
}  // namespace ham
