#pragma once
// Pre-norm Transformer: x += Attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x)); with RoPE on q, k,
// grouped-query heads, and an untied output head. With attn_conv_size W > 0 the attention
// reads q = silu(conv_q(q_proj x)), likewise k and v (depthwise causal convs of width W,
// stopping at document starts), before RoPE.
#include "models/language_model.h"
#include "nn/layers.h"

namespace ham {

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const ModelConfig& c, Generator& gen);
  Tensor forward(const Tensor& x, const TokenBatch& batch) const;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<ShortConvolution> q_conv, k_conv, v_conv;  // null unless attn_conv_size > 0

 private:
  int64_t n_heads_, n_kv_heads_, head_dim_, v_head_dim_;
  double rope_base_;
};

class TransformerBlock : public Module {
 public:
  TransformerBlock(const ModelConfig& c, Generator& gen);
  Tensor forward(const Tensor& x, const TokenBatch& batch) const;
  std::shared_ptr<RMSNorm> attn_norm, mlp_norm;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<SwiGLU> mlp;
};

class Transformer : public DecoderLM {
 public:
  explicit Transformer(const ModelConfig& config);
  Tensor hidden_states(const TokenBatch& batch) const override;
  std::vector<std::shared_ptr<TransformerBlock>> layers;
};

}  // namespace ham
