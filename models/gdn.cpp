#include "models/gdn.h"

#include <algorithm>
#include <cmath>

#include "autograd/node.h"
#include "nn/cast.h"
#include "nn/elementwise.h"
#include "nn/gated_delta_rule.h"
#include "nn/norm.h"
#include "nn/unary.h"
#include "nn/view.h"

namespace ham {

namespace {

// Residual-branch outputs start smaller so the sum over layers keeps unit scale (as in
// the Transformer).
double output_std(const ModelConfig& c) { return c.init_std / std::sqrt(2.0 * double(c.n_layers)); }

// Uniform(lo, hi) draws from the model's generator, or an unfilled tensor under
// SkipInitGuard (structure only).
std::vector<double> uniform_values(int64_t n, Generator& gen, double lo, double hi) {
  return uniform({n}, gen, lo, hi, DType::F32).to_vector<double>();
}

Tensor f32_vector(const std::vector<double>& values) {
  return Tensor::from_vector(values, {int64_t(values.size())}).to(DType::F32);
}

// A_log = log A with A ~ U(0, 16) (FLA's GatedDeltaNet); A is kept >= 1e-4 so that
// log A stays finite.
Tensor init_a_log(int64_t heads, Generator& gen) {
  if (SkipInitGuard::active()) return Tensor::empty({heads});
  std::vector<double> a = uniform_values(heads, gen, 0.0, 16.0);
  for (double& x : a) x = std::log(std::max(x, 1e-4));
  return f32_vector(a);
}

// dt ~ logUniform(1e-3, 0.1) (floored at 1e-4), stored as its softplus inverse,
// dt_bias = dt + log(1 - e^-dt), so that softplus(dt_bias) = dt at init.
Tensor init_dt_bias(int64_t heads, Generator& gen) {
  if (SkipInitGuard::active()) return Tensor::empty({heads});
  const double log_min = std::log(1e-3), log_max = std::log(0.1);
  std::vector<double> dt = uniform_values(heads, gen, log_min, log_max);
  for (double& x : dt) {
    double step = std::max(std::exp(x), 1e-4);
    x = step + std::log(-std::expm1(-step));
  }
  return f32_vector(dt);
}

}  // namespace

Tensor gdn_log_decay(const Tensor& a, const Tensor& A_log, const Tensor& dt_bias) {
  return mul(neg(exp(A_log)), softplus(add(cast(a, A_log.dtype()), dt_bias)));
}

GatedDeltaNet::GatedDeltaNet(const ModelConfig& c, Generator& gen)
    : heads_(c.gdn_heads), head_dim_(c.gdn_head_dim), v_head_dim_(c.gdn_v_head_dim),
      norm_eps_(c.norm_eps), keep_chunk_states_(c.gdn_keep_chunk_states) {
  InitOptions init{c.init_std};
  int64_t d = c.d_model, qk_dim = c.gdn_qk_dim(), v_dim = c.gdn_v_dim();
  q_proj = register_module("q_proj", std::make_shared<Linear>(d, qk_dim, false, gen, init));
  k_proj = register_module("k_proj", std::make_shared<Linear>(d, qk_dim, false, gen, init));
  v_proj = register_module("v_proj", std::make_shared<Linear>(d, v_dim, false, gen, init));
  q_conv = register_module("q_conv", std::make_shared<ShortConvolution>(qk_dim, c.conv_size, gen));
  k_conv = register_module("k_conv", std::make_shared<ShortConvolution>(qk_dim, c.conv_size, gen));
  v_conv = register_module("v_conv", std::make_shared<ShortConvolution>(v_dim, c.conv_size, gen));
  a_proj = register_module("a_proj", std::make_shared<Linear>(d, heads_, false, gen, init));
  b_proj = register_module("b_proj", std::make_shared<Linear>(d, heads_, false, gen, init));
  register_parameter("A_log", A_log, init_a_log(heads_, gen));
  register_parameter("dt_bias", dt_bias, init_dt_bias(heads_, gen));
  keep_full_precision(A_log);
  keep_full_precision(dt_bias);
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(d, v_dim, false, gen, init));
  o_norm = register_module("o_norm", std::make_shared<RMSNorm>(v_head_dim_, c.norm_eps));
  o_proj = register_module("o_proj", std::make_shared<Linear>(v_dim, d, false, gen,
                                                              InitOptions{output_std(c)}));
}

Tensor GatedDeltaNet::forward(const Tensor& x, const TokenBatch& batch) const {
  int64_t B = x.size(0), T = x.size(1);
  const Tensor& docs = batch.doc_ids;
  Tensor q = reshape(q_conv->forward(q_proj->forward(x), docs), {B, T, heads_, head_dim_});
  Tensor k = reshape(k_conv->forward(k_proj->forward(x), docs), {B, T, heads_, head_dim_});
  Tensor v = reshape(v_conv->forward(v_proj->forward(x), docs), {B, T, heads_, v_head_dim_});
  q = scale(l2_norm(q), 1.0 / std::sqrt(double(head_dim_)));
  k = l2_norm(k);
  Tensor beta = sigmoid(b_proj->forward(x));  // [B, T, h] write strength in (0, 1)
  // g = -A * dt <= 0 with A = exp(A_log) and dt = softplus(a_proj x + dt_bias): log decay.
  Tensor g = gdn_log_decay(a_proj->forward(x), A_log, dt_bias);
  GatedDeltaRuleResult recurrent =
      gated_delta_rule(q, k, v, g, beta, Tensor(), docs, gdn_keep(keep_chunk_states_),
                       /*want_fit_error=*/trace_fit_error_);
  trace_ = {detach(g), trace_fit_error_ ? detach(recurrent.fit_error) : Tensor()};
  Tensor o = recurrent.o;  // [B, T, h, V]
  Tensor gate = reshape(gate_proj->forward(x), {B, T, heads_, v_head_dim_});
  o = gated_rms_norm(o, gate, o_norm->weight, norm_eps_);
  return o_proj->forward(reshape(o, {B, T, heads_ * v_head_dim_}));
}

GDNBlock::GDNBlock(const ModelConfig& c, Generator& gen) {
  mixer_norm = register_module("mixer_norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps));
  mixer = register_module("mixer", std::make_shared<GatedDeltaNet>(c, gen));
  mlp_norm = register_module("mlp_norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps));
  mlp = register_module("mlp", std::make_shared<SwiGLU>(c.d_model, c.d_ff, gen,
                                                        InitOptions{c.init_std}, output_std(c)));
}

Tensor GDNBlock::forward(const Tensor& x, const TokenBatch& batch) const {
  Tensor h = add(x, mixer->forward(mixer_norm->forward(x), batch));
  return add(h, mlp->forward(mlp_norm->forward(h)));
}

GDNModel::GDNModel(const ModelConfig& c) : DecoderLM(c) {
  for (int64_t i = 0; i < c.n_layers; ++i) {
    layers.push_back(add_layer(i, std::make_shared<GDNBlock>(c, init_generator_)));
  }
  add_head();
}

Tensor GDNModel::hidden_states(const TokenBatch& batch) const {
  Tensor x = embed_tokens(batch, "GDNModel");
  for (size_t i = 0; i < layers.size(); ++i) x = run_block(int64_t(i), layers[i], x, batch);
  return x;
}

GDNGSAModel::GDNGSAModel(const ModelConfig& c) : DecoderLM(c) {
  attention_layers.resize(size_t(c.n_layers));
  gdn_layers.resize(size_t(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    if (c.is_attention_layer(i)) {
      attention_layers[size_t(i)] =
          add_layer(i, std::make_shared<TransformerBlock>(c, init_generator_));
    } else {
      gdn_layers[size_t(i)] = add_layer(i, std::make_shared<GDNBlock>(c, init_generator_));
    }
  }
  add_head();
}

Tensor GDNGSAModel::hidden_states(const TokenBatch& batch) const {
  Tensor x = embed_tokens(batch, "GDNGSAModel");
  for (size_t i = 0; i < gdn_layers.size(); ++i) {
    x = attention_layers[i] ? run_block(int64_t(i), attention_layers[i], x, batch)
                            : run_block(int64_t(i), gdn_layers[i], x, batch);
  }
  return x;
}

}  // namespace ham
