#include "nn/linear_cross_entropy.h"

#include <string>

#include "autograd/function.h"
#include "autograd/node.h"
#include "core/ops/cast.h"
#include "core/ops/elementwise.h"
#include "core/ops/linear_cross_entropy.h"

namespace ham {

namespace {

// The gradients of the summed loss were computed by the forward; the backward only scales
// them: dhidden = g * scale * grad_hidden, dweight = g * scale * grad_weight, g the 0-d
// incoming gradient (kept on the device: no readback).
class LinearCrossEntropyBackward final : public Node {
 public:
  Tensor grad_hidden, grad_weight;  // d(loss sum) / d input; undefined when not needed
  double scale = 1;                 // d(returned loss) / d(loss sum)

  std::string name() const override { return "LinearCrossEntropyBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor g = scale == 1.0 ? grads[0] : ops::scaled(grads[0], scale);
    // g is f32 for bf16 inputs (the loss is): scaled in the gradients' own dtype.
    auto scaled_by_g = [&](const Tensor& t) { return ops::mul(t, ops::cast(g, t.dtype())); };
    Tensor dhidden, dweight;
    if (needs_input_grad(*this, 0) && grad_hidden.defined()) dhidden = scaled_by_g(grad_hidden);
    if (needs_input_grad(*this, 1) && grad_weight.defined()) dweight = scaled_by_g(grad_weight);
    return {dhidden, dweight};
  }

  void release_saved() override { grad_hidden = grad_weight = Tensor(); }
};

// loss = scale * (sum over kept rows), recorded with one node.
CrossEntropyStats linear_cross_entropy_scaled(const Tensor& hidden, const Tensor& weight,
                                              const Tensor& targets, int64_t ignore_index,
                                              int64_t chunk_rows, bool mean) {
  const bool record = any_requires_grad({hidden, weight});
  const bool want_dh = record && hidden.defined() && requires_grad(hidden);
  const bool want_dw = record && weight.defined() && requires_grad(weight);
  ops::LinearCrossEntropyResult r = ops::linear_cross_entropy(
      hidden, weight, targets, ignore_index, chunk_rows, want_dh, want_dw);
  // With every row ignored the mean is 0 (loss_sum is 0) and so are its gradients.
  const double scale = !mean ? 1.0 : r.count > 0 ? 1.0 / double(r.count) : 0.0;
  Tensor loss = scale == 1.0 ? r.loss_sum : ops::scaled(r.loss_sum, scale);
  if (record) {
    auto node = std::make_shared<LinearCrossEntropyBackward>();
    node->grad_hidden = r.grad_hidden;
    node->grad_weight = r.grad_weight;
    node->scale = scale;
    connect(node, {hidden, weight}, {&loss});
  }
  return {loss, r.count};
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                            int64_t ignore_index, int64_t chunk_rows) {
  return linear_cross_entropy_scaled(hidden, weight, targets, ignore_index, chunk_rows, true).loss;
}

CrossEntropyStats linear_cross_entropy_sum(const Tensor& hidden, const Tensor& weight,
                                           const Tensor& targets, int64_t ignore_index,
                                           int64_t chunk_rows) {
  return linear_cross_entropy_scaled(hidden, weight, targets, ignore_index, chunk_rows, false);
}

}  // namespace ham
