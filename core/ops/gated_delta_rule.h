#pragma once
// Gated delta rule (Gated DeltaNet's sequence mixer), FLA's state orientation S [K x V].
//
// Inputs: q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H] (log decay, meant to be <= 0;
// g > 0 is computed as written but grows the state); beta [B, T, H] (write strength,
// any real); h0 [B, H, K, V] optional initial state; doc_ids [B, T] i32/i64 optional.
// Per (b, h), token by token (no scale inside the op; the layer scales q):
//   S <- exp(g_t) S                       decay
//   p_t = S^T k_t                         prediction of v_t by the decayed state
//   S <- S + beta_t k_t (v_t - p_t)^T     delta-rule write
//   o_t = S^T q_t                         read-out after the write
//   fit_error_t = 1 - <p_t, v_t> / (||p_t|| ||v_t|| + 1e-6)      in [0, 2]
// fit_error is the cosine distance between target and prediction BEFORE the write, with
// the prediction taken from the DECAYED state exp(g_t) S_{t-1}: that is the prediction
// the write corrects, v_new_t = beta_t (v_t - p_t), so the chunked form yields it for
// free. Where p_t = 0 (a document's first token without h0) the formula gives exactly 1.
// Documents: the state resets to 0 at every t > 0 with doc_ids[b, t] != doc_ids[b, t-1];
// h0 applies only to the segment starting at t = 0. h_final is the state after token T-1
// (h0, or 0, when T = 0).
//
// ---- Chunked form (training; chunk C = 64 tokens inside one document segment) ----
// For a chunk of c <= C tokens with start state S0 and rows Q, K [c, K], V [c, V]:
//   G_i = g_0 + ... + g_i (chunk-local cumsum),  E = e^G,  Gamma_ij = e^{G_i - G_j} (j <= i)
//   M = strict_tril(K K^T * Gamma),  P = tril(Q K^T * Gamma) (diagonal included)
//   (I + diag(beta) M) v_new = diag(beta) (V - diag(E) K S0)          forward substitution
//     [= U - W S0 with A = (I + diag(beta) M)^-1, U = A diag(beta) V,
//      W = A diag(beta E) K: the WY form, solved here without forming A]
//   O     = diag(E) Q S0 + P v_new
//   S_end = e^{G_last} S0 + K^T diag(e^{G_last - G}) v_new
//   pred  = diag(E) K S0 + M v_new    (row i is p_i; no division by beta, no extra pass)
// since the state before token i's write is e^{G_i} S0 + sum_{j<i} Gamma_ij k_j v_new_j^T.
// A chunk never crosses a document start: each segment is chunked from its first token.
//
// ---- Backward of one chunk (dO, dS_end given; chunks run in reverse, dS0 -> previous
// chunk's dS_end; the first segment's dS0 is dh0) ----
//   du    = P^T dO + diag(e^{G_last-G}) K dS_end                 (u = v_new)
//   dX    = (I + diag(beta) M)^-T du,  dR = diag(beta) dX,  dv = dR
//   dM    = -strict_tril(diag(beta) dX u^T)
//   dbeta = rowsum(-(dX u^T) * M) + rowsum(dX * R),   R = V - diag(E) K S0
//   dP    = tril(dO u^T)
//   dq    = diag(E) dO S0^T + (dP * Gamma) K
//   dk    = diag(e^{G_last-G}) u dS_end^T - diag(E) dR S0^T + (dP * Gamma)^T Q
//           + (dM * Gamma) K + (dM * Gamma)^T K
//   dS0   = e^{G_last} dS_end + Q^T diag(E) dO - K^T diag(E) dR
//   dG_i  = E_i <dO_i, (Q S0)_i> - E_i <dR_i, (K S0)_i> - e^{G_last-G_i} <(K dS_end)_i, u_i>
//           + rowsum(Z)_i - colsum(Z)_i,   Z = dP * P + dM * M   (through Gamma)
//   dG_last += e^{G_last} <S0, dS_end> + sum_j e^{G_last-G_j} <(K dS_end)_j, u_j>
//   dg    = reverse chunk-local cumsum of dG
// fit_error has no gradient (it feeds a hard threshold).
#include <cstdint>
#include <memory>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

// Tokens per chunk of the chunked form (CPU; a document segment is chunked from its start).
inline constexpr int64_t kGatedDeltaRuleChunkSize = 64;

// h0 and doc_ids may be undefined (Tensor()). Every floating input has q's dtype, except
// that bf16 q, k, v may come with f32 gates g (mixed precision keeps the log decay and its
// gradient in f32, as flash-linear-attention does); dg then is f32 too.
// What the chunked forward keeps for its backward (GatedDeltaRuleSaved), where its backend
// keeps anything (the CUDA tensor-core path; the CPU keeps nothing):
//   Nothing      the backward recomputes every chunk term from the inputs;
//   Inverses     each chunk's A = (I + diag(beta) M)^-1 (bf16, 64 values a token and head)
//                and, with doc_ids, the chunk table, as flash-linear-attention keeps A:
//                the backward's recompute then skips K K^T, the triangular inverse and the
//                table's kernel with its stream synchronisation, and still runs the state
//                pass. At K = V = 128 half of v's memory; at 256 x 384 a sixth;
//   ChunkStates  every chunk term (start states, v_new, W, A, gate cumsum): the backward
//                recomputes nothing. About five times v's size at K = V = 128.
// Memory for time, held from forward to backward; the backward's result is the same to the
// bit whichever was kept (the same kernels make the same terms).
enum class GatedDeltaRuleKeep { Nothing, Inverses, ChunkStates };

// want_fit_error false: the forward leaves the result's fit_error undefined and skips its
// work (a GDN layer's output does not read it; on the CUDA tensor-core path the output
// kernel then forms O alone, with no prediction rows and no copies of v).
struct GatedDeltaRuleArgs {
  Tensor q, k, v, g, beta, h0, doc_ids;
  GatedDeltaRuleKeep keep = GatedDeltaRuleKeep::Nothing;
  bool want_fit_error = true;
};

// What a backend's chunked forward kept for its backward (GatedDeltaRuleKeep). Opaque
// outside the backend that made it; a backend that keeps nothing leaves it null.
struct GatedDeltaRuleSaved {
  virtual ~GatedDeltaRuleSaved() = default;
  virtual int64_t bytes() const = 0;  // device memory held
};

struct GatedDeltaRuleResult {
  Tensor o;          // [B, T, H, V]
  Tensor h_final;    // [B, H, K, V]
  Tensor fit_error;  // [B, T, H]; undefined where the args did not want it
  std::shared_ptr<const GatedDeltaRuleSaved> saved{};  // what `keep` asked for, or null
};

// Gradients of the inputs; a kernel fills those defined on entry (dh0 only with h0).
struct GatedDeltaRuleGrads {
  Tensor dq, dk, dv, dg, dbeta, dh0;
};

// The tensors of each struct, for the CPU kernels' bf16 widening (core/bf16_widening.h).
template <class F>
void for_each_tensor(GatedDeltaRuleArgs& a, F&& f) {
  for (Tensor* t : {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.h0, &a.doc_ids}) f(*t);
}
template <class F>
void for_each_tensor(GatedDeltaRuleResult& r, F&& f) {
  for (Tensor* t : {&r.o, &r.h_final, &r.fit_error}) f(*t);
}
template <class F>
void for_each_tensor(GatedDeltaRuleGrads& g, F&& f) {
  for (Tensor* t : {&g.dq, &g.dk, &g.dv, &g.dg, &g.dbeta, &g.dh0}) f(*t);
}

// Chunked forward (training path) and the token-by-token recurrence (test reference and
// decoding); both fill the preallocated outputs, fit_error only where it is defined.
HAM_DECLARE_KERNEL_TABLE(gated_delta_rule_chunked,
                         void(const GatedDeltaRuleArgs&, GatedDeltaRuleResult& out));
HAM_DECLARE_KERNEL_TABLE(gated_delta_rule_naive,
                         void(const GatedDeltaRuleArgs&, GatedDeltaRuleResult& out));
// Backward of o and h_final (grad_o [B, T, H, V], grad_h_final [B, H, K, V]); recomputes
// the chunk states and v_new from the inputs, or reads them from `saved` (the same
// backend's forward of the same inputs; null: recompute).
HAM_DECLARE_KERNEL_TABLE(gated_delta_rule_backward,
                         void(const GatedDeltaRuleArgs&, const Tensor& grad_o,
                              const Tensor& grad_h_final, const GatedDeltaRuleSaved* saved,
                              GatedDeltaRuleGrads& grads));

namespace ops {

// Throws a one-line error naming `op`, the argument and the shapes when the inputs are
// inconsistent (shapes, dtypes, devices, doc_ids dtype).
void check_gated_delta_rule_args(const char* op, const GatedDeltaRuleArgs& args);

// No autograd. chunked: the training algorithm; naive: the plain recurrence.
GatedDeltaRuleResult gated_delta_rule_chunked(const GatedDeltaRuleArgs& args);
GatedDeltaRuleResult gated_delta_rule_naive(const GatedDeltaRuleArgs& args);

// grad_o and grad_h_final must be defined (zeros where unused). want_* pick the gradients
// to compute; dh0 is computed only when args.h0 is defined.
struct GatedDeltaRuleWanted {
  bool q = true, k = true, v = true, g = true, beta = true, h0 = true;
};
// saved: what the chunked forward of these args kept (GatedDeltaRuleKeep), or null.
GatedDeltaRuleGrads gated_delta_rule_backward(const GatedDeltaRuleArgs& args,
                                              const Tensor& grad_o, const Tensor& grad_h_final,
                                              const GatedDeltaRuleWanted& wanted = {},
                                              const GatedDeltaRuleSaved* saved = nullptr);

}  // namespace ops

namespace cpu {
void gated_delta_rule_chunked(const GatedDeltaRuleArgs& args, GatedDeltaRuleResult& out);
void gated_delta_rule_naive(const GatedDeltaRuleArgs& args, GatedDeltaRuleResult& out);
// The CPU keeps nothing (its backward recomputes per head); a non-null saved is an error.
void gated_delta_rule_backward(const GatedDeltaRuleArgs& args, const Tensor& grad_o,
                               const Tensor& grad_h_final, const GatedDeltaRuleSaved* saved,
                               GatedDeltaRuleGrads& grads);
}  // namespace cpu

}  // namespace ham
