#include "nn/reduce.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/reduce.h"
#include "core/ops/shape.h"

namespace ham {

namespace {

class ReduceBackward final : public Node {
 public:
  std::string op;  // "sum" or "mean"
  Shape input_shape;
  ReduceDims dims;
  double scale = 1;

  std::string name() const override { return op + "Backward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::reduce_sum_backward(grads[0], input_shape, dims, scale)};
  }
};

Tensor reduce(const char* op, const Tensor& x, const ReduceDims& dims, double scale,
              const Shape& out_shape) {
  Tensor y = ops::reduce_sum(op, x, dims, scale, out_shape);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<ReduceBackward>();
    node->op = op;
    node->input_shape = x.shape();
    node->dims = dims;
    node->scale = scale;
    connect(node, {x}, {&y});
  }
  return y;
}

Tensor reduce_dim(const char* op, const Tensor& x, int64_t dim, bool keepdim, bool is_mean) {
  dim = ops::normalize_dim(op, dim, x.shape());
  ReduceDims dims = ops::reduce_dims(x.shape(), dim);
  double scale = is_mean ? 1.0 / double(dims.len) : 1.0;
  return reduce(op, x, dims, scale, ops::reduced_shape(x.shape(), dim, keepdim));
}

}  // namespace

Tensor sum(const Tensor& x) { return reduce("sum", x, ReduceDims{1, x.numel(), 1}, 1.0, {}); }

Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  return reduce_dim("sum", x, dim, keepdim, false);
}

Tensor mean(const Tensor& x) {
  return reduce("mean", x, ReduceDims{1, x.numel(), 1}, 1.0 / double(x.numel()), {});
}

Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  return reduce_dim("mean", x, dim, keepdim, true);
}

}  // namespace ham
