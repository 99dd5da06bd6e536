#include "nn/swiglu.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/swiglu.h"

namespace ham {

namespace {

class SwigluBackward final : public Node {
 public:
  Tensor gate, up;
  std::string name() const override { return "SwigluBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    ops::SwigluGrads g = ops::swiglu_backward(grads[0], gate, up, needs_input_grad(*this, 0),
                                              needs_input_grad(*this, 1));
    return {g.dgate, g.dup};
  }
  void release_saved() override {
    gate = Tensor();
    up = Tensor();
  }
};

}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor out = ops::swiglu(gate, up);
  if (any_requires_grad({gate, up})) {
    auto node = std::make_shared<SwigluBackward>();
    node->gate = gate;
    node->up = up;
    connect(node, {gate, up}, {&out});
  }
  return out;
}

}  // namespace ham
