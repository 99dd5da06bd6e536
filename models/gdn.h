#pragma once
// Gated DeltaNet (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", 2024) as
// flash-linear-attention's GatedDeltaNet layer, and the GDN-GSA hybrid in which every
// gsa_every-th layer is global softmax attention (the Transformer's attention block).
//
// One GDN mixer, x [B, T, d], h heads, K = gdn_head_dim, V = gdn_v_head_dim:
//   q = silu(conv_q(q_proj x)),  k = silu(conv_k(k_proj x)),  v = silu(conv_v(v_proj x))
//       (depthwise causal convs of width conv_size; taps stop at document starts)
//   q = l2_norm(q) * K^-1/2,  k = l2_norm(k)                            per head
//   beta = sigmoid(b_proj x),  g = -exp(A_log) * softplus(a_proj x + dt_bias)   [B, T, h]
//   o = gated_delta_rule(q, k, v, g, beta)          state resets at document starts
//   out = o_proj( rms_norm(o, o_norm) * silu(gate_proj x) )   norm per head over V dims
// Parameters per GDN layer (the paper's appendix table, d_QK = hK, d_V = hV):
//   d (mixer_norm) + d(2 d_QK + d_V) + 2hd + 2h + W(2 d_QK + d_V) + d d_V + V + d_V d,
// plus the SwiGLU FFN d (mlp_norm) + 3 d d_ff.
#include "models/language_model.h"
#include "models/transformer.h"
#include "nn/layers.h"

namespace ham {

// Gated DeltaNet's log decay g = -exp(A_log) * softplus(a + dt_bias) <= 0, [B, T, h] from
// a = a_proj(x). Computed in A_log's dtype: under mixed precision A_log and dt_bias stay
// f32 (as flash-linear-attention keeps them), so g and its gradient are f32 while a is
// bf16; the gated delta rule takes f32 gates with bf16 q, k, v.
Tensor gdn_log_decay(const Tensor& a, const Tensor& A_log, const Tensor& dt_bias);

// The GDN sequence mixer (formulas at the top of this file).
class GatedDeltaNet : public Module {
 public:
  GatedDeltaNet(const ModelConfig& c, Generator& gen);
  Tensor forward(const Tensor& x, const TokenBatch& batch) const;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, a_proj, b_proj, gate_proj, o_proj;
  std::shared_ptr<ShortConvolution> q_conv, k_conv, v_conv;
  Tensor A_log;    // [h]: decay rate A = exp(A_log) > 0
  Tensor dt_bias;  // [h]: softplus(dt_bias) is the initial time step
  std::shared_ptr<RMSNorm> o_norm;  // weight [V], shared by all heads

  // What the last forward computed, for analysis (detached, [B, T, h] each): the log decay
  // g_t (the gate is alpha_t = exp(g_t)) and the delta rule's per-head fit error, the
  // latter only where trace_fit_error is on (else undefined).
  struct Trace {
    Tensor log_decay, fit_error;
  };
  const Trace& last_trace() const { return trace_; }
  // Whether forward also computes the delta rule's fit error for last_trace(). Off by
  // default: the layer's output does not read it (only HAM's router does), and the forward
  // is cheaper without it. The analysis turns it on; a setting of the trace, hence const.
  void trace_fit_error(bool on) const { trace_fit_error_ = on; }
  bool traces_fit_error() const { return trace_fit_error_; }

 private:
  int64_t heads_, head_dim_, v_head_dim_;
  double norm_eps_;
  bool keep_chunk_states_;
  mutable bool trace_fit_error_ = false;
  mutable Trace trace_;
};

// x += GDN(RMSNorm(x)); x += SwiGLU(RMSNorm(x)).
class GDNBlock : public Module {
 public:
  GDNBlock(const ModelConfig& c, Generator& gen);
  Tensor forward(const Tensor& x, const TokenBatch& batch) const;
  std::shared_ptr<RMSNorm> mixer_norm, mlp_norm;
  std::shared_ptr<GatedDeltaNet> mixer;
  std::shared_ptr<SwiGLU> mlp;
};

// Embedding -> n_layers GDN blocks -> RMSNorm -> untied lm_head.
class GDNModel : public DecoderLM {
 public:
  explicit GDNModel(const ModelConfig& config);
  Tensor hidden_states(const TokenBatch& batch) const override;
  std::vector<std::shared_ptr<GDNBlock>> layers;
};

// GDN blocks with a TransformerBlock (RoPE softmax attention over the whole document)
// at every layer i where config.is_attention_layer(i), i.e. every gsa_every-th layer.
class GDNGSAModel : public DecoderLM {
 public:
  explicit GDNGSAModel(const ModelConfig& config);
  Tensor hidden_states(const TokenBatch& batch) const override;
  // Layer i is exactly one of the two: attention_layers[i] set where
  // config.is_attention_layer(i), gdn_layers[i] elsewhere (the other entry is null).
  std::vector<std::shared_ptr<TransformerBlock>> attention_layers;
  std::vector<std::shared_ptr<GDNBlock>> gdn_layers;
};

}  // namespace ham
