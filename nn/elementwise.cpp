#include "nn/elementwise.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/elementwise.h"

namespace ham {

namespace {

class BinaryBackward final : public Node {
 public:
  BinaryOp op;
  Tensor a, b;  // saved only where the formula needs them
  Shape a_shape, b_shape;

  std::string name() const override {
    return std::string(binary_op_name(op)) + "Backward";
  }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& dy = grads[0];
    Tensor da, db;
    bool want_a = needs_input_grad(*this, 0), want_b = needs_input_grad(*this, 1);
    switch (op) {
      case BinaryOp::Add:
        if (want_a) da = ops::sum_to(dy, a_shape);
        if (want_b) db = ops::sum_to(dy, b_shape);
        break;
      case BinaryOp::Sub:
        if (want_a) da = ops::sum_to(dy, a_shape);
        if (want_b) db = ops::scaled(ops::sum_to(dy, b_shape), -1.0);
        break;
      case BinaryOp::Mul:
        if (want_a) da = ops::sum_to(ops::mul(dy, b), a_shape);
        if (want_b) db = ops::sum_to(ops::mul(dy, a), b_shape);
        break;
      case BinaryOp::Div:
        if (want_a) da = ops::sum_to(ops::div(dy, b), a_shape);
        if (want_b) {
          Tensor a_over_b2 = ops::div(ops::div(a, b), b);
          db = ops::scaled(ops::sum_to(ops::mul(dy, a_over_b2), b_shape), -1.0);
        }
        break;
    }
    return {da, db};
  }

  void release_saved() override {
    a = Tensor();
    b = Tensor();
  }
};

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor y = ops::binary(op, a, b);
  if (any_requires_grad({a, b})) {
    auto node = std::make_shared<BinaryBackward>();
    node->op = op;
    node->a_shape = a.shape();
    node->b_shape = b.shape();
    if (op == BinaryOp::Mul || op == BinaryOp::Div) {
      node->a = a;
      node->b = b;
    }
    connect(node, {a, b}, {&y});
  }
  return y;
}

class ScaleBackward final : public Node {
 public:
  double alpha = 1;
  std::string name() const override { return "ScaleBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::scaled(grads[0], alpha)};
  }
};

class AddScalarBackward final : public Node {
 public:
  std::string name() const override { return "AddScalarBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override { return {grads[0]}; }
};

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Div, a, b); }

Tensor scale(const Tensor& x, double alpha) {
  Tensor y = ops::scaled(x, alpha);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<ScaleBackward>();
    node->alpha = alpha;
    connect(node, {x}, {&y});
  }
  return y;
}

Tensor add_scalar(const Tensor& x, double c) {
  Tensor y = ops::add(x, Tensor::scalar(c, x.dtype(), x.device()));
  if (any_requires_grad({x})) connect(std::make_shared<AddScalarBackward>(), {x}, {&y});
  return y;
}

}  // namespace ham
