#pragma once
// HAM's routing scores e_t [B, T]: how much token t should enter the KV cache (the paper's
// appendix "Router Implementations"). A token is cached when e_t >= tau.
//
//   fit_error      e_t = Agg_h fit_error_t^(h), the cosine distance between the GDN state's
//                  prediction S_{t-1}^T k_t and v_t, taken from the same gated_delta_rule
//                  forward; Agg is min (the paper's default: every head must be surprised)
//                  or max. Lies in [0, 2]; exactly 1 at a document's first token. No
//                  gradient: it only feeds the hard threshold.
//   input_shallow  e_t = sigmoid(W_r x_t), W_r [1, d] without bias (the parameter table's
//                  W_router row counts exactly d_hidden weights).
//   input_deep     e_t = sigmoid(W_3 gelu(W_2 gelu(W_1 x_t))), W_1 [h, d], W_2 [h, h],
//                  W_3 [1, h], h = router_hidden (256 in the paper). The table has no row
//                  for it; we count d h + h^2 + h weights (no biases, like the shallow one).
//
// Learned scores reach the loss only through value scaling (v_KV <- e_t v_KV inside
// routed_attention); the selection itself is a hard, gradient-free threshold.
// The paper evaluates the input routers in fp32; on CPU the model is f32 (or f64 for
// gradchecks), so the router runs at least at that precision.
//
// EDA (depth averaging, learned routers): e^l <- gamma_l e^l + (1 - gamma_l) e^(l-1), where
// e^(l-1) is the previous layer's (already averaged) score and gamma_l = sigmoid(logit_l),
// logit_l = 0 at init (gamma = 0.5). Layer 0 has no previous score, so no gamma.
#include <memory>

#include "models/config.h"
#include "nn/layers.h"

namespace ham {

// Aggregates per-head scores [B, T, H] over heads (min or max) into [B, T]; no gradient.
Tensor aggregate_head_scores(const Tensor& per_head, HeadAggregate aggregate);

// A learned function of the layer's (normalised) input x [B, T, d] -> e [B, T] in (0, 1).
// Learned routers keep f32 parameters under mixed precision (Module::keep_full_precision)
// and return an f32 score for bf16 inputs.
class InputRouter : public Module {
 public:
  InputRouter(RouterKind kind, int64_t d_model, int64_t hidden, Generator& gen, double init_std);
  Tensor forward(const Tensor& x) const;
  // Weights the kind owns: d (shallow) or d h + h^2 + h (deep).
  static int64_t parameter_count(RouterKind kind, int64_t d_model, int64_t hidden);

  RouterKind kind;
  std::shared_ptr<Linear> proj;          // shallow: [1, d]
  std::shared_ptr<Linear> fc1, fc2, fc3;  // deep: [h, d], [h, h], [1, h]
};

// EDA: the learned convex mix of this layer's score with the previous layer's.
class DepthAverage : public Module {
 public:
  DepthAverage();
  // gamma e + (1 - gamma) e_previous, gamma = sigmoid(gamma_logit); [B, T] each.
  Tensor forward(const Tensor& score, const Tensor& previous_score) const;
  double gamma() const;
  Tensor gamma_logit;  // [1], 0 at init
};

}  // namespace ham
