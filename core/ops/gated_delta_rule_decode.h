#pragma once
// The gated delta rule at decoding time: n new tokens per sequence (usually 1) advance a
// carried state in place. Per (b, h), token by token, the recurrence of
// core/ops/gated_delta_rule.h (one document: no resets inside a call):
//   S <- exp(g_t) S;   p_t = S^T k_t;   fit_error_t = 1 - <p_t, v_t> / (||p_t|| ||v_t|| + 1e-6)
//   S <- S + beta_t k_t (v_t - p_t)^T;   o_t = S^T q_t
//
//   q, k [B, n, H, K]; v [B, n, H, V]; g, beta [B, n, H] (g may be f32 with bf16 q, k, v)
//   state [B, H, K, V]: f32 for f32 and bf16 inputs, f64 for f64; read and written in place
//   -> o [B, n, H, V] and fit_error [B, n, H] in q's dtype
//
// The state stays f32 across calls whatever the activations' dtype, as it does inside the
// chunked kernels over a sequence: a bf16 model that decodes token by token does not round
// its state to bf16 at every token. Stepping a sequence through this op one token at a time
// gives the chunked forward's o, fit_error and final state (tests/nn/test_gated_delta_rule_decode.cpp).
//
// Kernels: the CPU reference (core/cpu/gated_delta_rule_decode.cpp, the same token step as
// gated_delta_rule_naive) and a fused recurrent CUDA kernel (cuda/gated_delta_rule_decode.cu:
// the state tile in registers, read and written once per call). Inference only: no backward.
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

// Writes o and fit_error; updates state in place. Arguments checked by the caller.
HAM_DECLARE_KERNEL_TABLE(gated_delta_rule_decode,
                         void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                              const Tensor& beta, Tensor& state, Tensor& o, Tensor& fit_error));

namespace ops {

struct GatedDeltaRuleStep {
  Tensor o;          // [B, n, H, V]
  Tensor fit_error;  // [B, n, H]
};

// The dtype of the decoding state for inputs of `dtype` (f32, or f64 for f64).
DType gated_delta_rule_state_dtype(DType dtype);

// Throws a one-line "gated_delta_rule_decode: ..." error naming the argument and shapes
// when the inputs do not fit the shapes above (the state's dtype included).
GatedDeltaRuleStep gated_delta_rule_decode(Tensor& state, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& g, const Tensor& beta);

}  // namespace ops

namespace cpu {
void gated_delta_rule_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                             const Tensor& beta, Tensor& state, Tensor& o, Tensor& fit_error);
}  // namespace cpu

}  // namespace ham
