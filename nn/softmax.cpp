#include "nn/softmax.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/softmax.h"

namespace ham {

namespace {

// Both backwards need only the output y.
class SoftmaxBackward final : public Node {
 public:
  Tensor y;
  bool log = false;
  std::string name() const override { return log ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {log ? ops::log_softmax_backward(y, grads[0]) : ops::softmax_backward(y, grads[0])};
  }
  void release_saved() override { y = Tensor(); }
};

Tensor softmax_impl(const Tensor& x, bool log) {
  Tensor y = log ? ops::log_softmax(x) : ops::softmax(x);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<SoftmaxBackward>();
    node->y = detach(y);  // the output itself would hold its own grad_fn (a cycle)
    node->log = log;
    connect(node, {x}, {&y});
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x) { return softmax_impl(x, false); }
Tensor log_softmax(const Tensor& x) { return softmax_impl(x, true); }

}  // namespace ham
