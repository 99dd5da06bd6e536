#include "nn/gated_delta_rule.h"

#include <string>

#include "autograd/function.h"

namespace ham {

namespace {

// Outputs (o, h_final); inputs (q, k, v, g, beta, h0). Recomputes chunk states from the
// saved inputs (formulas in core/ops/gated_delta_rule.h), or reads those the forward kept.
class GatedDeltaRuleBackward final : public Node {
 public:
  GatedDeltaRuleArgs args;
  std::shared_ptr<const GatedDeltaRuleSaved> kept;  // what the forward kept, or null
  std::string name() const override { return "GatedDeltaRuleBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    ops::GatedDeltaRuleWanted wanted;
    wanted.q = needs_input_grad(*this, 0);
    wanted.k = needs_input_grad(*this, 1);
    wanted.v = needs_input_grad(*this, 2);
    wanted.g = needs_input_grad(*this, 3);
    wanted.beta = needs_input_grad(*this, 4);
    wanted.h0 = needs_input_grad(*this, 5);
    GatedDeltaRuleGrads d =
        ops::gated_delta_rule_backward(args, grads[0], grads[1], wanted, kept.get());
    return {d.dq, d.dk, d.dv, d.dg, d.dbeta, d.dh0};
  }

  void release_saved() override {
    args = GatedDeltaRuleArgs();
    kept.reset();
  }
};

}  // namespace

GatedDeltaRuleResult gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& g, const Tensor& beta, const Tensor& h0,
                                      const Tensor& doc_ids, GatedDeltaRuleKeep keep,
                                      bool want_fit_error) {
  const bool wants_grad = any_requires_grad({q, k, v, g, beta, h0});
  GatedDeltaRuleArgs args{q, k, v, g, beta, h0, doc_ids,
                          wants_grad ? keep : GatedDeltaRuleKeep::Nothing, want_fit_error};
  GatedDeltaRuleResult out = ops::gated_delta_rule_chunked(args);
  if (wants_grad) {
    auto node = std::make_shared<GatedDeltaRuleBackward>();
    node->kept = std::move(out.saved);
    node->args = std::move(args);
    node->args.keep = GatedDeltaRuleKeep::Nothing;
    connect(node, {q, k, v, g, beta, h0}, {&out.o, &out.h_final});
  }
  return out;
}

GatedDeltaRuleResult gated_delta_rule_reference(const Tensor& q, const Tensor& k,
                                                const Tensor& v, const Tensor& g,
                                                const Tensor& beta, const Tensor& h0,
                                                const Tensor& doc_ids) {
  return ops::gated_delta_rule_naive({q, k, v, g, beta, h0, doc_ids});
}

}  // namespace ham
