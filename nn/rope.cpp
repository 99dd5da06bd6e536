#include "nn/rope.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/rope.h"

namespace ham {

namespace {

class RopeBackward final : public Node {
 public:
  double base = 0;
  Tensor positions;  // undefined: pos = t
  std::string name() const override { return "RopeBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::rope_backward(grads[0], base, positions)};
  }
  void release_saved() override { positions = Tensor(); }
};

}  // namespace

Tensor rope(const Tensor& x, double base, const Tensor& positions) {
  Tensor y = ops::rope(x, base, positions);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<RopeBackward>();
    node->base = base;
    node->positions = positions;
    connect(node, {x}, {&y});
  }
  return y;
}

}  // namespace ham
