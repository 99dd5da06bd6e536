#include "models/ham.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "nn/cast.h"
#include "nn/elementwise.h"
#include "nn/gated_delta_rule.h"
#include "nn/norm.h"
#include "nn/rope.h"
#include "nn/routed_attention.h"
#include "nn/unary.h"
#include "nn/view.h"

namespace ham {

namespace {

// [n] f32 values transform(u), u ~ U(lo, hi) (uninitialised under SkipInitGuard).
Tensor transformed_uniform(int64_t n, Generator& gen, double lo, double hi,
                           const std::function<double(double)>& transform) {
  if (SkipInitGuard::active()) return Tensor::empty({n});
  std::vector<double> u = uniform({n}, gen, lo, hi, DType::F64).to_vector<double>();
  std::vector<float> values;
  for (double x : u) values.push_back(float(transform(x)));
  return Tensor::from_vector(values, {n});
}

}  // namespace

// ---- HAMPathInputs --------------------------------------------------------------------

HAMPathInputs::HAMPathInputs(int64_t qk_dim, int64_t v_dim, const ModelConfig& c,
                             Generator& gen) {
  q_conv = register_module("q_conv", std::make_shared<ShortConvolution>(qk_dim, c.conv_size, gen));
  k_conv = register_module("k_conv", std::make_shared<ShortConvolution>(qk_dim, c.conv_size, gen));
  v_conv = register_module("v_conv", std::make_shared<ShortConvolution>(v_dim, c.conv_size, gen));
  q_norm = register_module("q_norm", std::make_shared<RMSNorm>(qk_dim, c.norm_eps));
  k_norm = register_module("k_norm", std::make_shared<RMSNorm>(qk_dim, c.norm_eps));
  v_norm = register_module("v_norm", std::make_shared<RMSNorm>(v_dim, c.norm_eps));
}

HAMPathInputs::QKV HAMPathInputs::forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& doc_ids) const {
  return {q_norm->forward(q_conv->forward(q, doc_ids)),
          k_norm->forward(k_conv->forward(k, doc_ids)),
          v_norm->forward(v_conv->forward(v, doc_ids))};
}

// ---- HAMLayer -------------------------------------------------------------------------

HAMLayer::HAMLayer(const ModelConfig& c, int64_t layer, Generator& gen)
    : threshold(c.tau, c.tau_scale()), config_(c), layer_(layer) {
  int64_t d = c.d_model, qk = c.gdn_qk_dim(), vd = c.gdn_v_dim(), heads = c.gdn_heads;
  InitOptions init{c.init_std};
  // Residual-branch outputs start smaller so the sum over layers keeps unit scale.
  InitOptions out_init{c.init_std / std::sqrt(2.0 * double(c.n_layers))};

  q_proj = register_module("q_proj", std::make_shared<Linear>(d, qk, false, gen, init));
  k_proj = register_module("k_proj", std::make_shared<Linear>(d, qk, false, gen, init));
  v_proj = register_module("v_proj", std::make_shared<Linear>(d, vd, false, gen, init));
  rnn = register_module("rnn", std::make_shared<HAMPathInputs>(qk, vd, c, gen));
  kv = register_module("kv", std::make_shared<HAMPathInputs>(qk, vd, c, gen));

  // Gated DeltaNet's scalars: decay rate A ~ U(0, 16) (kept > 0 for the log), and dt in
  // [1e-3, 0.1] log-uniform stored as its inverse softplus, dt + log(1 - e^-dt).
  a_proj = register_module("a_proj", std::make_shared<Linear>(d, heads, false, gen, init));
  b_proj = register_module("b_proj", std::make_shared<Linear>(d, heads, false, gen, init));
  register_parameter("A_log", A_log, transformed_uniform(heads, gen, 0.0, 16.0, [](double a) {
                       return std::log(std::max(a, 1e-4));
                     }));
  register_parameter("dt_bias", dt_bias,
                     transformed_uniform(heads, gen, std::log(1e-3), std::log(0.1), [](double log_dt) {
                       double dt = std::max(std::exp(log_dt), 1e-4);
                       return dt + std::log(-std::expm1(-dt));
                     }));
  keep_full_precision(A_log);
  keep_full_precision(dt_bias);

  gate_proj = register_module("gate_proj", std::make_shared<Linear>(d, vd, false, gen, init));
  rnn_out_norm = register_module("rnn_out_norm",
                                 std::make_shared<RMSNorm>(c.gdn_v_head_dim, c.norm_eps));
  kv_out_norm = register_module("kv_out_norm", std::make_shared<RMSNorm>(c.v_head_dim, c.norm_eps));
  rnn_gate = register_module("rnn_gate", std::make_shared<Linear>(d, heads, false, gen, init));
  kv_gate = register_module("kv_gate", std::make_shared<Linear>(d, c.n_heads, false, gen, init));
  o_proj = register_module("o_proj", std::make_shared<Linear>(vd, d, false, gen, out_init));

  if (c.router != RouterKind::FitError) {
    router = register_module("router", std::make_shared<InputRouter>(c.router, d, c.router_hidden,
                                                                     gen, c.init_std));
    if (c.eda && layer > 0) eda = register_module("eda", std::make_shared<DepthAverage>());
  }
}

HAMLayer::Output HAMLayer::forward(const Tensor& x, const TokenBatch& batch,
                                   const Tensor& previous_score) const {
  const ModelConfig& c = config_;
  HAM_CHECK(x.dim() == 3 && x.size(2) == c.d_model, "HAMLayer ", layer_,
            ": input must be [B, T, ", c.d_model, "], got ", shape_str(x.shape()));
  int64_t B = x.size(0), T = x.size(1);
  int64_t rnn_heads = c.gdn_heads, rnn_k = c.gdn_head_dim, rnn_v = c.gdn_v_head_dim;
  int64_t kv_heads = c.n_heads, kv_k = c.head_dim, kv_v = c.v_head_dim;

  Tensor q = q_proj->forward(x), k = k_proj->forward(x), v = v_proj->forward(x);

  // RNN path (Gated DeltaNet). Its forward also yields the per-head fit error.
  HAMPathInputs::QKV r = rnn->forward(q, k, v, batch.doc_ids);
  Tensor rnn_q = scale(l2_norm(reshape(r.q, {B, T, rnn_heads, rnn_k})), 1.0 / std::sqrt(double(rnn_k)));
  Tensor rnn_k_heads = l2_norm(reshape(r.k, {B, T, rnn_heads, rnn_k}));
  Tensor rnn_v_heads = reshape(r.v, {B, T, rnn_heads, rnn_v});
  // g = -exp(A_log) softplus(W_a x + dt_bias) <= 0;  beta = sigmoid(W_b x).
  Tensor log_decay = gdn_log_decay(a_proj->forward(x), A_log, dt_bias);
  Tensor beta = sigmoid(b_proj->forward(x));
  GatedDeltaRuleResult recurrent =
      gated_delta_rule(rnn_q, rnn_k_heads, rnn_v_heads, log_decay, beta, Tensor(), batch.doc_ids,
                       gdn_keep(c.gdn_keep_chunk_states));

  // Routing score e_t and the hard selection m_t = [e_t >= tau].
  Tensor score;
  if (router) {
    score = router->forward(x);
    if (eda && previous_score.defined()) score = eda->forward(score, previous_score);
  } else {
    score = aggregate_head_scores(recurrent.fit_error, c.router_aggregate);
  }
  double tau = threshold.tau();
  std::vector<double> scores = score.to_vector<double>();
  std::vector<uint8_t> selected(scores.size());
  trace_.kv_fraction_per_sequence.assign(size_t(B), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t count = 0;
    for (int64_t t = 0; t < T; ++t) {
      size_t i = size_t(b * T + t);
      selected[i] = scores[i] >= tau ? 1 : 0;
      count += selected[i];
    }
    trace_.kv_fraction_per_sequence[size_t(b)] = T > 0 ? double(count) / double(T) : 0.0;
  }
  Tensor select = Tensor::from_vector(selected, {B, T}).to(x.device());
  trace_.score = detach(score);
  trace_.select = select;
  trace_.fit_error = recurrent.fit_error;
  trace_.log_decay = detach(log_decay);
  trace_.score_in_graph = Tensor();
  if (retain_score_grad && requires_grad(score)) {
    retain_grad(score);
    trace_.score_in_graph = score;
  }

  // KV path: attention over the selected tokens only. Learned scores scale the values,
  // which is how the router receives a gradient.
  HAMPathInputs::QKV a = kv->forward(q, k, v, batch.doc_ids);
  Tensor kv_q = rope(reshape(a.q, {B, T, kv_heads, kv_k}), c.rope_base, batch.positions);
  Tensor kv_k_heads = rope(reshape(a.k, {B, T, kv_heads, kv_k}), c.rope_base, batch.positions);
  Tensor kv_v_heads = reshape(a.v, {B, T, kv_heads, kv_v});
  // The value scale takes the values' dtype (a learned router's score is f32 also in a
  // bf16 model; the cast sends its gradient back in f32).
  Tensor kv_out = routed_attention(kv_q, kv_k_heads, kv_v_heads, select,
                                   router ? cast(score, kv_v_heads.dtype()) : Tensor(),
                                   batch.doc_ids, 1.0 / std::sqrt(double(kv_k)));
  if (keep_path_outputs) {
    trace_.kv_q = detach(kv_q);
    trace_.kv_k = detach(kv_k_heads);
    trace_.kv_v = detach(kv_v_heads);
    trace_.kv_output = detach(kv_out);
    trace_.rnn_output = detach(recurrent.o);
  } else {
    trace_.kv_q = trace_.kv_k = trace_.kv_v = trace_.kv_output = trace_.rnn_output = Tensor();
  }

  // o = g_RNN * GatedNorm(o_RNN) + g_KV * Norm(o_KV), per-head gates broadcast over each
  // head's channels; heads merged to [B, T, d_V] before the sum (h_RNN != h_KV).
  Tensor rnn_gated = mul(gated_rms_norm(recurrent.o,
                                        reshape(gate_proj->forward(x), {B, T, rnn_heads, rnn_v}),
                                        rnn_out_norm->weight, c.norm_eps),
                         reshape(sigmoid(rnn_gate->forward(x)), {B, T, rnn_heads, 1}));
  Tensor kv_gated = mul(kv_out_norm->forward(kv_out),
                        reshape(sigmoid(kv_gate->forward(x)), {B, T, kv_heads, 1}));
  Tensor mixed = add(reshape(rnn_gated, {B, T, c.gdn_v_dim()}), reshape(kv_gated, {B, T, c.gdn_v_dim()}));
  return {o_proj->forward(mixed), score};
}

int64_t HAMLayer::table_parameter_count(const ModelConfig& c, int64_t layer) {
  int64_t d = c.d_model, qk = c.gdn_qk_dim(), vd = c.gdn_v_dim();
  // The pre-norm's d is the "+ 1" in d (3 h_RNN + h_KV + 2 d_V + 1).
  int64_t count = (d + 2 * c.conv_size + 2) * (2 * qk + vd) +
                  d * (3 * c.gdn_heads + c.n_heads + 2 * vd + 1) + 2 * c.gdn_heads +
                  c.gdn_v_head_dim + c.v_head_dim;
  if (c.learn_tau) count += 1;
  count += InputRouter::parameter_count(c.router, d, c.router_hidden);
  if (c.router != RouterKind::FitError && c.eda && layer > 0) count += 1;
  return count;
}

// ---- HAMBlock -------------------------------------------------------------------------

HAMBlock::HAMBlock(const ModelConfig& c, int64_t layer, Generator& gen) {
  mixer_norm = register_module("mixer_norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps));
  mixer = register_module("mixer", std::make_shared<HAMLayer>(c, layer, gen));
  mlp_norm = register_module("mlp_norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps));
  mlp = register_module("mlp", std::make_shared<SwiGLU>(c.d_model, c.d_ff, gen,
                                                        InitOptions{c.init_std},
                                                        c.init_std / std::sqrt(2.0 * double(c.n_layers))));
}

HAMLayer::Output HAMBlock::forward(const Tensor& x, const TokenBatch& batch,
                                   const Tensor& previous_score) const {
  HAMLayer::Output m = mixer->forward(mixer_norm->forward(x), batch, previous_score);
  Tensor h = add(x, m.out);
  return {add(h, mlp->forward(mlp_norm->forward(h))), m.score};
}

// ---- HAMModel -------------------------------------------------------------------------

HAMModel::HAMModel(const ModelConfig& c) : DecoderLM(c) {
  HAM_CHECK(c.family == ModelFamily::HAM, "HAMModel: config family is '", family_name(c.family),
            "', expected 'ham'");
  c.validate("HAMModel");
  for (int64_t i = 0; i < c.n_layers; ++i) {
    layers.push_back(add_layer(i, std::make_shared<HAMBlock>(c, i, init_generator_)));
  }
  add_head();
  if (c.learn_tau) {
    ThresholdLearningOptions options;
    for (int64_t i = 0; i < c.n_layers; ++i) options.targets.push_back(c.kv_target_for_layer(i));
    options.gain = c.tau_gain;
    options.clip = c.tau_clip;
    options.lr = c.tau_lr;
    options.freeze_steps = c.tau_freeze_steps;
    thresholds_ = std::make_unique<ThresholdController>(threshold_state(), options);
  }
}

Tensor HAMModel::hidden_states(const TokenBatch& batch) const {
  Tensor x = embed_tokens(batch, "HAMModel");
  Tensor previous_score;  // EDA: the previous layer's score
  bool pass_score = config_.eda;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& layer = layers[i];
    const int64_t index = int64_t(i);
    std::vector<Tensor> in = enter_block(index, {x, previous_score});
    std::vector<Tensor> out;  // {x} or, with EDA, {x, score}
    if (config_.recompute) {
      std::vector<Tensor> inputs = {in[0]};
      if (in[1].defined()) inputs.push_back(in[1]);
      out = checkpoint(
          [layer, batch, pass_score](const std::vector<Tensor>& block_inputs) {
            HAMLayer::Output r = layer->forward(block_inputs[0], batch,
                                                block_inputs.size() > 1 ? block_inputs[1] : Tensor());
            return pass_score ? std::vector<Tensor>{r.out, r.score} : std::vector<Tensor>{r.out};
          },
          inputs);
    } else {
      HAMLayer::Output r = layer->forward(in[0], batch, in[1]);
      out = pass_score ? std::vector<Tensor>{r.out, r.score} : std::vector<Tensor>{r.out};
    }
    out = leave_block(index, out);
    x = out[0];
    if (pass_score) previous_score = out[1];
  }
  // Algorithm 2 counts training forwards only (evaluation runs without grad mode).
  if (thresholds_ && GradMode::is_enabled()) {
    std::vector<std::vector<double>> fractions;
    for (const auto& layer : layers) {
      fractions.push_back(layer->mixer->last_trace().kv_fraction_per_sequence);
    }
    thresholds_->record_forward(fractions);
  }
  return x;
}

std::vector<LayerRouting> HAMModel::routing() const {
  std::vector<LayerRouting> out;
  for (size_t i = 0; i < layers.size(); ++i) {
    const HAMLayer& mixer = *layers[i]->mixer;
    const std::vector<double>& fractions = mixer.last_trace().kv_fraction_per_sequence;
    double mean = 0;
    for (double f : fractions) mean += f;
    if (!fractions.empty()) mean /= double(fractions.size());
    out.push_back({int64_t(i), mean, mixer.threshold.tau()});
  }
  return out;
}

void HAMModel::after_optimizer_step(int64_t step) {
  if (thresholds_) thresholds_->after_optimizer_step(step);
}

std::vector<std::pair<std::string, Tensor>> HAMModel::threshold_state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (!config_.learn_tau) return out;
  for (size_t i = 0; i < layers.size(); ++i) {
    out.emplace_back("layers." + std::to_string(i) + ".mixer.p_tau",
                     layers[i]->mixer->threshold.p_tau());
  }
  return out;
}

void HAMModel::load_threshold_state(const std::vector<std::pair<std::string, Tensor>>& values) {
  std::map<std::string, Tensor> by_name(values.begin(), values.end());
  for (auto& [name, slot] : threshold_state()) {
    auto it = by_name.find(name);
    HAM_CHECK(it != by_name.end(), "HAMModel::load_threshold_state: missing '", name, "'");
    HAM_CHECK(it->second.numel() == 1, "HAMModel::load_threshold_state: '", name,
              "' must hold one value, got ", shape_str(it->second.shape()));
    Tensor target = slot;
    target.copy_(it->second.reshape(slot.shape()).to(slot.dtype()).to(slot.device()));
  }
}

std::vector<std::pair<std::string, Tensor>> HAMModel::training_state() const {
  std::vector<std::pair<std::string, Tensor>> out = threshold_state();
  if (!thresholds_) return out;
  for (auto& [name, moment] : thresholds_->optimizer().state()) {
    out.emplace_back("threshold_optimizer." + name, moment);
  }
  out.emplace_back("threshold_optimizer.steps",
                   Tensor::from_vector(std::vector<int64_t>{thresholds_->optimizer().steps_taken()}, {1}));
  return out;
}

void HAMModel::load_training_state(const std::vector<std::pair<std::string, Tensor>>& state) {
  if (!thresholds_) return;
  load_threshold_state(state);
  const std::string prefix = "threshold_optimizer.";
  std::vector<std::pair<std::string, Tensor>> moments;
  int64_t steps = -1;
  for (const auto& [name, value] : state) {
    if (name == prefix + "steps") {
      steps = int64_t(value.to_vector<double>().at(0));
    } else if (name.rfind(prefix, 0) == 0) {
      moments.emplace_back(name.substr(prefix.size()), value);
    }
  }
  HAM_CHECK(steps >= 0, "HAMModel::load_training_state: missing '", prefix, "steps'");
  thresholds_->optimizer().load_state(moments, steps);
}

void HAMModel::set_threshold_all_reduce(std::function<double(double)> all_reduce_mean) {
  if (thresholds_) thresholds_->all_reduce_mean = std::move(all_reduce_mean);
}

int64_t HAMModel::table_parameter_count() const {
  return num_parameters() + (config_.learn_tau ? config_.n_layers : 0);
}

}  // namespace ham
