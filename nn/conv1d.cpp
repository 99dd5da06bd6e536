#include "nn/conv1d.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/conv1d.h"

namespace ham {

namespace {

class CausalConv1dBackward final : public Node {
 public:
  Tensor x, weight, bias, doc_ids;  // bias: kept only with an activation
  Conv1dActivation activation = Conv1dActivation::None;
  std::string name() const override {
    return activation == Conv1dActivation::SiLU ? "CausalConv1dSiluBackward"
                                                : "CausalConv1dBackward";
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    ops::CausalConv1dGrads g = ops::causal_conv1d_backward(
        grads[0], x, weight, needs_input_grad(*this, 0), needs_input_grad(*this, 1),
        needs_input_grad(*this, 2), doc_ids, bias, activation);
    return {g.dx, g.dweight, g.dbias};
  }
  void release_saved() override {
    x = Tensor();
    weight = Tensor();
    bias = Tensor();
    doc_ids = Tensor();
  }
};

}  // namespace

Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                     const Tensor& doc_ids, Conv1dActivation activation) {
  Tensor y = ops::causal_conv1d(x, weight, bias, doc_ids, activation);
  if (any_requires_grad({x, weight, bias})) {
    auto node = std::make_shared<CausalConv1dBackward>();
    node->x = x;
    node->weight = weight;
    if (activation != Conv1dActivation::None) node->bias = bias;
    node->doc_ids = doc_ids;
    node->activation = activation;
    connect(node, {x, weight, bias}, {&y});
  }
  return y;
}

}  // namespace ham
