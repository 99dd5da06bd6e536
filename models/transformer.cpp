#include "models/transformer.h"

#include <cmath>

#include "nn/elementwise.h"
#include "nn/rope.h"
#include "nn/routed_attention.h"
#include "nn/view.h"

namespace ham {


CausalSelfAttention::CausalSelfAttention(const ModelConfig& c, Generator& gen)
    : n_heads_(c.n_heads), n_kv_heads_(c.n_kv_heads), head_dim_(c.head_dim),
      v_head_dim_(c.v_head_dim), rope_base_(c.rope_base) {
  InitOptions init{c.init_std};
  // Residual-branch outputs start smaller so the sum over layers keeps unit scale.
  InitOptions out_init{c.init_std / std::sqrt(2.0 * double(c.n_layers))};
  q_proj = register_module("q_proj", std::make_shared<Linear>(c.d_model, c.n_heads * c.head_dim, false, gen, init));
  k_proj = register_module("k_proj", std::make_shared<Linear>(c.d_model, c.n_kv_heads * c.head_dim, false, gen, init));
  v_proj = register_module("v_proj", std::make_shared<Linear>(c.d_model, c.n_kv_heads * c.v_head_dim, false, gen, init));
  o_proj = register_module("o_proj", std::make_shared<Linear>(c.n_heads * c.v_head_dim, c.d_model, false, gen, out_init));
  if (c.attn_conv_size > 0) {
    q_conv = register_module("q_conv", std::make_shared<ShortConvolution>(c.n_heads * c.head_dim, c.attn_conv_size, gen));
    k_conv = register_module("k_conv", std::make_shared<ShortConvolution>(c.n_kv_heads * c.head_dim, c.attn_conv_size, gen));
    v_conv = register_module("v_conv", std::make_shared<ShortConvolution>(c.n_kv_heads * c.v_head_dim, c.attn_conv_size, gen));
  }
}

Tensor CausalSelfAttention::forward(const Tensor& x, const TokenBatch& batch) const {
  int64_t B = x.size(0), T = x.size(1);
  Tensor q = q_proj->forward(x), k = k_proj->forward(x), v = v_proj->forward(x);
  if (q_conv) {
    q = q_conv->forward(q, batch.doc_ids);
    k = k_conv->forward(k, batch.doc_ids);
    v = v_conv->forward(v, batch.doc_ids);
  }
  q = reshape(q, {B, T, n_heads_, head_dim_});
  k = reshape(k, {B, T, n_kv_heads_, head_dim_});
  v = reshape(v, {B, T, n_kv_heads_, v_head_dim_});
  q = rope(q, rope_base_, batch.positions);
  k = rope(k, rope_base_, batch.positions);
  // Dense causal attention is routed attention with every token selected.
  Tensor all_selected = Tensor::full({B, T}, 1.0, DType::U8, x.device());
  Tensor o = routed_attention(q, k, v, all_selected, Tensor(), batch.doc_ids,
                              1.0 / std::sqrt(double(head_dim_)));
  return o_proj->forward(reshape(o, {B, T, n_heads_ * v_head_dim_}));
}

TransformerBlock::TransformerBlock(const ModelConfig& c, Generator& gen) {
  attn_norm = register_module("attn_norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(c, gen));
  mlp_norm = register_module("mlp_norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps));
  mlp = register_module("mlp", std::make_shared<SwiGLU>(c.d_model, c.d_ff, gen,
                                                        InitOptions{c.init_std},
                                                        c.init_std / std::sqrt(2.0 * double(c.n_layers))));
}

Tensor TransformerBlock::forward(const Tensor& x, const TokenBatch& batch) const {
  Tensor h = add(x, attn->forward(attn_norm->forward(x), batch));
  return add(h, mlp->forward(mlp_norm->forward(h)));
}

Transformer::Transformer(const ModelConfig& c) : DecoderLM(c) {
  for (int64_t i = 0; i < c.n_layers; ++i) {
    layers.push_back(add_layer(i, std::make_shared<TransformerBlock>(c, init_generator_)));
  }
  add_head();
}

Tensor Transformer::hidden_states(const TokenBatch& batch) const {
  Tensor x = embed_tokens(batch, "Transformer");
  for (size_t i = 0; i < layers.size(); ++i) x = run_block(int64_t(i), layers[i], x, batch);
  return x;
}


}  // namespace ham
