#include <cstdint>
#include <string>

#include "core/ops/gated_delta_rule.h"

namespace ham {

HAM_DEFINE_KERNEL_TABLE(gated_delta_rule_chunked, &cpu::gated_delta_rule_chunked,
                        void(const GatedDeltaRuleArgs&, GatedDeltaRuleResult& out))
HAM_DEFINE_KERNEL_TABLE(gated_delta_rule_naive, &cpu::gated_delta_rule_naive,
                        void(const GatedDeltaRuleArgs&, GatedDeltaRuleResult& out))
HAM_DEFINE_KERNEL_TABLE(gated_delta_rule_backward, &cpu::gated_delta_rule_backward,
                        void(const GatedDeltaRuleArgs&, const Tensor& grad_o,
                             const Tensor& grad_h_final, const GatedDeltaRuleSaved* saved,
                             GatedDeltaRuleGrads& grads))

namespace ops {

namespace {

// "q [2, 5, 3, 16]"
std::string described(const char* name, const Tensor& t) {
  return std::string(name) + " " + shape_str(t.shape());
}

void check_like_q(const char* op, const char* name, const Tensor& t, const Tensor& q) {
  HAM_CHECK(t.dtype() == q.dtype(), op, ": ", name, " is ", t.str(), " but q is ", q.str(),
            " (dtypes must match)");
  HAM_CHECK(t.device() == q.device(), op, ": ", name, " is ", t.str(), " but q is ", q.str(),
            " (devices must match)");
}

}  // namespace

void check_gated_delta_rule_args(const char* op, const GatedDeltaRuleArgs& a) {
  const Tensor &q = a.q, &k = a.k, &v = a.v, &g = a.g, &beta = a.beta;
  HAM_CHECK(q.defined() && k.defined() && v.defined() && g.defined() && beta.defined(), op,
            ": q, k, v, g and beta must all be given");
  HAM_CHECK(is_floating(q.dtype()), op, ": q must be floating point, got ", q.str());
  HAM_CHECK(q.dim() == 4, op, ": ", described("q", q), " must be [B, T, H, K]");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  HAM_CHECK(k.shape() == q.shape(), op, ": ", described("k", k), " must match ",
            described("q", q));
  HAM_CHECK(v.dim() == 4 && v.size(0) == B && v.size(1) == T && v.size(2) == H, op, ": ",
            described("v", v), " must be [B, T, H, V] with B, T, H of ", described("q", q));
  const int64_t V = v.size(3);
  Shape gate_shape{B, T, H};
  HAM_CHECK(g.shape() == gate_shape, op, ": ", described("g", g), " must be [B, T, H] = ",
            shape_str(gate_shape), " for ", described("q", q));
  HAM_CHECK(beta.shape() == gate_shape, op, ": ", described("beta", beta),
            " must be [B, T, H] = ", shape_str(gate_shape), " for ", described("q", q));
  check_like_q(op, "k", k, q);
  check_like_q(op, "v", v, q);
  // Mixed precision: f32 log-decay gates with bf16 q, k, v (and the gradient dg in f32).
  const bool wide_gates = q.dtype() == DType::BF16 && g.dtype() == DType::F32;
  if (!wide_gates) check_like_q(op, "g", g, q);
  HAM_CHECK(g.device() == q.device(), op, ": g is ", g.str(), " but q is ", q.str(),
            " (devices must match)");
  check_like_q(op, "beta", beta, q);
  if (a.h0.defined()) {
    Shape state_shape{B, H, K, V};
    HAM_CHECK(a.h0.shape() == state_shape, op, ": ", described("h0", a.h0),
              " must be [B, H, K, V] = ", shape_str(state_shape), " for ", described("q", q),
              " and ", described("v", v));
    check_like_q(op, "h0", a.h0, q);
  }
  if (a.doc_ids.defined()) {
    HAM_CHECK(a.doc_ids.shape() == (Shape{B, T}), op, ": ", described("doc_ids", a.doc_ids),
              " must be [B, T] = ", shape_str(Shape{B, T}), " for ", described("q", q));
    HAM_CHECK(a.doc_ids.dtype() == DType::I32 || a.doc_ids.dtype() == DType::I64, op,
              ": doc_ids must be i32 or i64, got ", a.doc_ids.str());
    HAM_CHECK(a.doc_ids.device() == q.device(), op, ": doc_ids is ", a.doc_ids.str(),
              " but q is ", q.str(), " (devices must match)");
  }
}

namespace {

GatedDeltaRuleResult allocate_outputs(const GatedDeltaRuleArgs& a) {
  const Tensor& q = a.q;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = a.v.size(3);
  GatedDeltaRuleResult out;
  out.o = Tensor::empty({B, T, H, V}, q.dtype(), q.device());
  out.h_final = Tensor::empty({B, H, K, V}, q.dtype(), q.device());
  if (a.want_fit_error) out.fit_error = Tensor::empty({B, T, H}, q.dtype(), q.device());
  return out;
}

}  // namespace

GatedDeltaRuleResult gated_delta_rule_chunked(const GatedDeltaRuleArgs& args) {
  check_gated_delta_rule_args("gated_delta_rule", args);
  GatedDeltaRuleResult out = allocate_outputs(args);
  gated_delta_rule_chunked_kernels()(args.q.device(), args, out);
  return out;
}

GatedDeltaRuleResult gated_delta_rule_naive(const GatedDeltaRuleArgs& args) {
  check_gated_delta_rule_args("gated_delta_rule_naive", args);
  GatedDeltaRuleResult out = allocate_outputs(args);
  gated_delta_rule_naive_kernels()(args.q.device(), args, out);
  return out;
}

GatedDeltaRuleGrads gated_delta_rule_backward(const GatedDeltaRuleArgs& args,
                                              const Tensor& grad_o, const Tensor& grad_h_final,
                                              const GatedDeltaRuleWanted& wanted,
                                              const GatedDeltaRuleSaved* saved) {
  const char* op = "gated_delta_rule_backward";
  check_gated_delta_rule_args(op, args);
  const Tensor& q = args.q;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3),
                V = args.v.size(3);
  Shape o_shape{B, T, H, V}, state_shape{B, H, K, V};
  HAM_CHECK(grad_o.defined() && grad_o.shape() == o_shape, op, ": grad_o ",
            grad_o.defined() ? shape_str(grad_o.shape()) : "(undefined)", " must be ",
            shape_str(o_shape));
  HAM_CHECK(grad_h_final.defined() && grad_h_final.shape() == state_shape, op,
            ": grad_h_final ",
            grad_h_final.defined() ? shape_str(grad_h_final.shape()) : "(undefined)",
            " must be ", shape_str(state_shape));
  check_like_q(op, "grad_o", grad_o, q);
  check_like_q(op, "grad_h_final", grad_h_final, q);

  GatedDeltaRuleGrads grads;
  auto make = [&](bool want, const Tensor& like) {
    return want ? Tensor::empty(like.shape(), like.dtype(), like.device()) : Tensor();
  };
  grads.dq = make(wanted.q, q);
  grads.dk = make(wanted.k, args.k);
  grads.dv = make(wanted.v, args.v);
  grads.dg = make(wanted.g, args.g);
  grads.dbeta = make(wanted.beta, args.beta);
  grads.dh0 = make(wanted.h0 && args.h0.defined(), args.h0);
  gated_delta_rule_backward_kernels()(q.device(), args, grad_o, grad_h_final, saved, grads);
  return grads;
}

}  // namespace ops
}  // namespace ham
