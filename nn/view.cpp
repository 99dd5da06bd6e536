#include "nn/view.h"

#include <string>

#include "autograd/function.h"

namespace ham {

namespace {

class ReshapeBackward final : public Node {
 public:
  Shape input_shape;
  std::string name() const override { return "ReshapeBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {grads[0].reshape(input_shape)};
  }
};

// dX = zeros with dY written at rows [begin, end).
class SliceRowsBackward final : public Node {
 public:
  Shape input_shape;
  int64_t begin = 0;
  std::string name() const override { return "SliceRowsBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& dy = grads[0];
    Tensor dx = Tensor::zeros(input_shape, dy.dtype(), dy.device());
    Tensor rows = dx.slice(begin, begin + dy.size(0));
    rows.copy_(dy);
    return {dx};
  }
};

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor y = x.reshape(shape);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<ReshapeBackward>();
    node->input_shape = x.shape();
    connect(node, {x}, {&y});
  }
  return y;
}

Tensor slice_rows(const Tensor& x, int64_t begin, int64_t end) {
  Tensor y = x.slice(begin, end);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<SliceRowsBackward>();
    node->input_shape = x.shape();
    node->begin = begin;
    connect(node, {x}, {&y});
  }
  return y;
}

}  // namespace ham
