#include "nn/norm.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/norm.h"

namespace ham {

namespace {

// Inputs in order: x, gate, weight (gate and weight may be undefined: no edge).
class RmsNormBackward final : public Node {
 public:
  bool gated = false;
  Tensor x, gate, weight, rstd;

  std::string name() const override { return gated ? "GatedRmsNormBackward" : "RmsNormBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    ops::RmsNormGrads g =
        ops::rms_norm_backward(grads[0], x, gate, weight, rstd, needs_input_grad(*this, 0),
                               needs_input_grad(*this, 1), needs_input_grad(*this, 2));
    return {g.dx, g.dgate, g.dweight};
  }

  void release_saved() override {
    x = gate = weight = rstd = Tensor();
  }
};

Tensor rms_norm_op(const char* op, const Tensor& x, const Tensor& gate, const Tensor& weight,
                   double eps) {
  ops::NormResult r = ops::rms_norm(op, x, gate, weight, eps);
  if (any_requires_grad({x, gate, weight})) {
    auto node = std::make_shared<RmsNormBackward>();
    node->gated = gate.defined();
    node->x = x;
    node->gate = gate;
    node->weight = weight;
    node->rstd = r.rstd;
    connect(node, {x, gate, weight}, {&r.y});
  }
  return r.y;
}

class L2NormBackward final : public Node {
 public:
  Tensor x, rstd;

  std::string name() const override { return "L2NormBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::l2_norm_backward(grads[0], x, rstd)};
  }

  void release_saved() override { x = rstd = Tensor(); }
};

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return rms_norm_op("rms_norm", x, Tensor(), weight, eps);
}

Tensor gated_rms_norm(const Tensor& x, const Tensor& gate, const Tensor& weight, double eps) {
  HAM_CHECK(gate.defined(), "gated_rms_norm: gate is an undefined tensor");
  return rms_norm_op("gated_rms_norm", x, gate, weight, eps);
}

Tensor l2_norm(const Tensor& x, double eps) {
  ops::NormResult r = ops::l2_norm(x, eps);
  if (any_requires_grad({x})) {
    auto node = std::make_shared<L2NormBackward>();
    node->x = x;
    node->rstd = r.rstd;
    connect(node, {x}, {&r.y});
  }
  return r.y;
}

}  // namespace ham
