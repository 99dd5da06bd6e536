#include "models/transformer.h"

#include "models/gdn.h"
#include "models/ham.h"

#include <cmath>

#include "autograd/checkpoint.h"
#include "nn/cross_entropy.h"
#include "nn/elementwise.h"
#include "nn/rope.h"
#include "nn/routed_attention.h"
#include "nn/view.h"

namespace ham {

Tensor LanguageModel::loss(const TokenBatch& batch) const {
  Tensor logits = forward(batch);
  int64_t vocab = logits.size(-1);
  return cross_entropy(reshape(logits, {-1, vocab}), batch.targets.reshape({-1}));
}

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
}

Tensor CausalSelfAttention::forward(const Tensor& x, const TokenBatch& batch) const {
  int64_t B = x.size(0), T = x.size(1);
  Tensor q = reshape(q_proj->forward(x), {B, T, n_heads_, head_dim_});
  Tensor k = reshape(k_proj->forward(x), {B, T, n_kv_heads_, head_dim_});
  Tensor v = reshape(v_proj->forward(x), {B, T, n_kv_heads_, v_head_dim_});
  q = rope(q, rope_base_, batch.positions);
  k = rope(k, rope_base_, batch.positions);
  // Dense causal attention is routed attention with every token selected.
  Tensor all_selected = Tensor::full({B, T}, 1.0, DType::U8);
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

Transformer::Transformer(const ModelConfig& c) : LanguageModel(c) {
  Generator gen(c.seed);
  embed = register_module("embed", std::make_shared<Embedding>(c.vocab_size, c.d_model, gen,
                                                               InitOptions{c.init_std}));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    layers.push_back(register_module("layers." + std::to_string(i),
                                     std::make_shared<TransformerBlock>(c, gen)));
  }
  final_norm = register_module("final_norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps));
  lm_head = register_module("lm_head", std::make_shared<Linear>(c.d_model, c.vocab_size, false,
                                                                gen, InitOptions{c.init_std}));
}

Tensor Transformer::forward(const TokenBatch& batch) const {
  HAM_CHECK(batch.inputs.dim() == 2, "Transformer: inputs must be [B, T], got ",
            shape_str(batch.inputs.shape()));
  Tensor x = embed->forward(batch.inputs);
  for (const auto& layer : layers) {
    if (config_.recompute) {
      x = checkpoint([layer, batch](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{layer->forward(in[0], batch)};
          }, {x})[0];
    } else {
      x = layer->forward(x, batch);
    }
  }
  return lm_head->forward(final_norm->forward(x));
}

std::shared_ptr<LanguageModel> make_model(const ModelConfig& config) {
  switch (config.family) {
    case ModelFamily::Transformer: return std::make_shared<Transformer>(config);
    case ModelFamily::GDN: return std::make_shared<GDNModel>(config);
    case ModelFamily::GDNGSA: return std::make_shared<GDNGSAModel>(config);
    case ModelFamily::HAM: return std::make_shared<HAMModel>(config);
  }
  HAM_FAIL("make_model: unknown family");
}

}  // namespace ham
