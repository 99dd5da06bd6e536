#include "nn/cross_entropy.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"

namespace ham {

namespace {

class CrossEntropyBackward final : public Node {
 public:
  Tensor logits, targets, lse;
  int64_t ignore_index = -100;
  double scale = 1;  // d(returned loss) / d(loss sum)

  std::string name() const override { return "CrossEntropyBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::cross_entropy_backward(logits, targets, lse, ignore_index, grads[0], scale)};
  }

  void release_saved() override { logits = targets = lse = Tensor(); }
};

// loss = scale * (sum over kept rows), recorded with one node.
CrossEntropyStats cross_entropy_scaled(const Tensor& logits, const Tensor& targets,
                                       int64_t ignore_index, bool mean) {
  ops::CrossEntropyResult r = ops::cross_entropy(logits, targets, ignore_index);
  // With every row ignored the mean is 0 (loss_sum is 0) and so is its gradient.
  double scale = !mean ? 1.0 : r.count > 0 ? 1.0 / double(r.count) : 0.0;
  Tensor loss = scale == 1.0 ? r.loss_sum : ops::scaled(r.loss_sum, scale);
  if (any_requires_grad({logits})) {
    auto node = std::make_shared<CrossEntropyBackward>();
    node->logits = logits;
    node->targets = targets;
    node->lse = r.lse;
    node->ignore_index = ignore_index;
    node->scale = scale;
    connect(node, {logits}, {&loss});
  }
  return {loss, r.count};
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  return cross_entropy_scaled(logits, targets, ignore_index, true).loss;
}

CrossEntropyStats cross_entropy_sum(const Tensor& logits, const Tensor& targets,
                                    int64_t ignore_index) {
  return cross_entropy_scaled(logits, targets, ignore_index, false);
}

}  // namespace ham
