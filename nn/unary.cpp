#include "nn/unary.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/unary.h"

namespace ham {

namespace {

class UnaryBackward final : public Node {
 public:
  UnaryOp op = UnaryOp::Exp;
  Tensor saved;  // x or y per unary_saves(op); undefined for Nothing

  std::string name() const override { return std::string(unary_op_name(op)) + "Backward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::unary_backward(op, grads[0], saved)};
  }

  void release_saved() override { saved = Tensor(); }
};

Tensor unary(UnaryOp op, const Tensor& x) {
  Tensor y = ops::unary(op, x);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<UnaryBackward>();
    node->op = op;
    switch (unary_saves(op)) {
      case UnarySaved::Input: node->saved = x; break;
      // A detached view: saving y itself would make y -> node -> y a reference cycle.
      case UnarySaved::Output: node->saved = detach(y); break;
      case UnarySaved::Nothing: break;
    }
    connect(node, {x}, {&y});
  }
  return y;
}

}  // namespace

Tensor exp(const Tensor& x) { return unary(UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::Log, x); }
Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::Sigmoid, x); }
Tensor silu(const Tensor& x) { return unary(UnaryOp::Silu, x); }
Tensor softplus(const Tensor& x) { return unary(UnaryOp::Softplus, x); }
Tensor gelu(const Tensor& x) { return unary(UnaryOp::Gelu, x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::Tanh, x); }
Tensor neg(const Tensor& x) { return unary(UnaryOp::Neg, x); }
Tensor square(const Tensor& x) { return unary(UnaryOp::Square, x); }
Tensor sqrt(const Tensor& x) { return unary(UnaryOp::Sqrt, x); }
Tensor relu(const Tensor& x) { return unary(UnaryOp::Relu, x); }

}  // namespace ham
