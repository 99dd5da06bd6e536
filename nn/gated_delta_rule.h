#pragma once
// Differentiable gated delta rule (Gated DeltaNet's recurrence), one autograd node with a
// hand-derived backward. Definitions, shapes, the chunked algorithm and the backward
// formulas are in core/ops/gated_delta_rule.h; in short, per (b, h) with S [K x V]:
//   S <- exp(g_t) S;  p_t = S^T k_t;  S <- S + beta_t k_t (v_t - p_t)^T;  o_t = S^T q_t
//   fit_error_t = 1 - <p_t, v_t> / (||p_t|| ||v_t|| + 1e-6)   (decayed state, before the write)
// q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H] log decay (<= 0 by intent); beta [B, T, H];
// h0 [B, H, K, V] optional; doc_ids [B, T] i32/i64 optional (state resets where the id
// changes; h0 only seeds the segment at t = 0). No scale on q inside the op.
//
// Gradients flow to q, k, v, g, beta and h0 (when given) from both o and h_final.
// fit_error carries no gradient: it is returned detached (requires_grad false), so a
// loss built on it sends nothing back into the op.
#include "core/ops/gated_delta_rule.h"
#include "core/tensor.h"

namespace ham {

// Chunked forward (training path). keep: what the forward keeps for the backward when a
// gradient is wanted (GatedDeltaRuleKeep, core/ops/gated_delta_rule.h), where the backend
// keeps anything (the CUDA bf16 path), holding that memory until the backward runs: by
// default each chunk's A, as flash-linear-attention does; Nothing for the least memory,
// ChunkStates for the fastest backward. The result's `saved` stays empty (the graph node
// holds it). Without a gradient nothing is kept. want_fit_error false: the result's
// fit_error is undefined and the forward skips its work (GatedDeltaRuleArgs).
GatedDeltaRuleResult gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& g, const Tensor& beta,
                                      const Tensor& h0 = Tensor(),
                                      const Tensor& doc_ids = Tensor(),
                                      GatedDeltaRuleKeep keep = GatedDeltaRuleKeep::Inverses,
                                      bool want_fit_error = true);

// What a model keeps for its layers' backward: every chunk term where its key
// gdn_keep_chunk_states is set, else each chunk's A (the default).
inline GatedDeltaRuleKeep gdn_keep(bool keep_chunk_states) {
  return keep_chunk_states ? GatedDeltaRuleKeep::ChunkStates : GatedDeltaRuleKeep::Inverses;
}

// The token-by-token recurrence, no autograd (test ground truth, decoding).
GatedDeltaRuleResult gated_delta_rule_reference(const Tensor& q, const Tensor& k,
                                                const Tensor& v, const Tensor& g,
                                                const Tensor& beta, const Tensor& h0 = Tensor(),
                                                const Tensor& doc_ids = Tensor());

}  // namespace ham
