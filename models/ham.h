#pragma once
// HAM: Hybrid Associative Memory (the paper's section 2 and Algorithm 1). Each layer runs
// a Gated DeltaNet RNN over every token and, in parallel, softmax attention over only the
// tokens whose routing score e_t reaches the threshold tau (the "scratchpad" KV cache):
//
//   x  = RMSNorm(h)                                   pre-norm (the block's mixer_norm)
//   q, k, v = W_q x, W_k x, W_v x                     shared by both paths
//   RNN path: q, k, v -> own conv + SiLU + RMSNorm; q, k L2-normalised per head, q * K^-1/2
//             g = -exp(A_log) softplus(W_a x + dt_bias), beta = sigmoid(W_b x)
//             o_RNN, fit_error = gated_delta_rule(q, k, v, g, beta)
//   score:    e_t = Agg_h fit_error (or a learned router on x; optional EDA across layers)
//   select:   m_t = [e_t >= tau]                      hard, no gradient
//   KV path:  q, k, v -> own conv + SiLU + RMSNorm; RoPE on q, k
//             o_KV = attention over {i <= t : m_i = 1, same document}, values scaled by
//             e_i for learned routers (their only gradient path)
//   o = W_o( sigmoid(W_gr x) * GatedNorm(o_RNN, silu(W_gate x)) + sigmoid(W_gk x) * Norm(o_KV) )
//
// Where the q/k/v RMSNorms sit (the paper only lists them, "RNN RMS norms 2 d_QK + d_V",
// "KV RMS norms 2 d_QK + d_V"): each path normalises its own conv output, full width
// ([d_QK], [d_QK], [d_V] weights, one RMS over all heads), after the SiLU, i.e.
// proj -> conv -> SiLU -> RMSNorm. Being per path they must come after the shared
// projection; putting them after the path's conv gives each path's q, k, v a controlled
// scale whatever its conv weights do (for the KV path this is the usual QK-norm before
// RoPE; the RNN path still L2-normalises q, k per head as GDN does).
//
// The two paths have different head counts (h_RNN vs h_KV) but the same width d_V, so the
// gated, normalised outputs are added after merging heads to [B, T, d_V], each gate
// broadcast over its own head's channels.
//
// Parameters per layer equal the paper's table (tab:params_ham), Layer Total:
//   (d + 2 d_conv + 2)(2 d_QK + d_V) + d (3 h_RNN + h_KV + 2 d_V + 1) + 2 h_RNN
//   + d_RNN-V-head + d_KV-V-head + [learned tau: 1] + [learned router: its weights]
// (the pre-norm is the "+ 1" in the second term and lives in HAMBlock as mixer_norm), with
// the learned tau kept outside the module's parameters (see models/threshold.h) and the
// router counted as d (shallow), d h + h^2 + h (deep), plus 1 per layer after the first
// for EDA's gamma.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/gdn.h"
#include "models/language_model.h"
#include "models/router.h"
#include "models/threshold.h"
#include "nn/layers.h"

namespace ham {

// One path's private input stage: q, k, v -> conv -> SiLU -> RMSNorm, each its own weights
// (ShortConvolution, shared with the GDN model, is the conv followed by SiLU).
class HAMPathInputs : public Module {
 public:
  HAMPathInputs(int64_t qk_dim, int64_t v_dim, const ModelConfig& c, Generator& gen);
  struct QKV {
    Tensor q, k, v;  // [B, T, d_QK], [B, T, d_QK], [B, T, d_V]
  };
  QKV forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc_ids) const;
  std::shared_ptr<ShortConvolution> q_conv, k_conv, v_conv;
  std::shared_ptr<RMSNorm> q_norm, k_norm, v_norm;
};

// What one layer did in its last forward pass (for routing(), Algorithm 2, tests, analysis).
struct HAMLayerTrace {
  Tensor score;   // [B, T] routing score e_t (detached)
  Tensor select;  // [B, T] u8
  Tensor fit_error;  // [B, T, h_RNN] per-head fit error of the RNN path (detached)
  Tensor log_decay;  // [B, T, h_RNN] g_t; the gate is alpha_t = exp(g_t) (detached)
  // Only with retain_score_grad: the score as used in the graph, with retain_grad set, so
  // grad(score_in_graph) after backward is dL/de_t (learned routers' value-scaling path).
  Tensor score_in_graph;
  std::vector<double> kv_fraction_per_sequence;  // selected / tokens, per batch row
  // Only with keep_path_outputs (detached): the KV path's attention inputs after RoPE
  // [B, T, h_KV, K] / [B, T, h_KV, V] and its raw output, and the RNN path's raw output.
  Tensor kv_q, kv_k, kv_v, kv_output, rnn_output;
};

class HAMLayer : public Module {
 public:
  // `layer`: 0-based depth (EDA's gamma exists from layer 1 on).
  HAMLayer(const ModelConfig& c, int64_t layer, Generator& gen);

  struct Output {
    Tensor out;    // [B, T, d]: the mixer's residual-branch output
    Tensor score;  // [B, T]: e_t after EDA (differentiable for learned routers)
  };
  // x: the pre-normed hidden states [B, T, d]. `previous_score`: the previous layer's
  // score for EDA (undefined for layer 0 or without EDA).
  Output forward(const Tensor& x, const TokenBatch& batch, const Tensor& previous_score) const;

  // The paper's "Layer Total" for this layer: the pre-norm (which lives in HAMBlock), this
  // module's weights, and 1 for a learned tau (not a module parameter).
  static int64_t table_parameter_count(const ModelConfig& c, int64_t layer);

  Threshold threshold;
  const HAMLayerTrace& last_trace() const { return trace_; }
  bool keep_path_outputs = false;  // tests: keep the path outputs in last_trace()
  bool retain_score_grad = false;  // keep dL/de_t reachable through last_trace()

  std::shared_ptr<Linear> q_proj, k_proj, v_proj;
  std::shared_ptr<HAMPathInputs> rnn, kv;
  std::shared_ptr<Linear> a_proj, b_proj;
  Tensor A_log, dt_bias;  // [h_RNN]
  std::shared_ptr<Linear> gate_proj;                   // RNN norm gate [d_V, d]
  std::shared_ptr<RMSNorm> rnn_out_norm, kv_out_norm;  // [V_RNN-head], [V_KV-head]
  std::shared_ptr<Linear> rnn_gate, kv_gate;           // per-head gates [h_RNN, d], [h_KV, d]
  std::shared_ptr<Linear> o_proj;
  std::shared_ptr<InputRouter> router;  // learned routers only
  std::shared_ptr<DepthAverage> eda;    // EDA, layers >= 1 only

 private:
  ModelConfig config_;
  int64_t layer_;
  mutable HAMLayerTrace trace_;
};

// x += HAMLayer(RMSNorm(x)); x += SwiGLU(RMSNorm(x)).
class HAMBlock : public Module {
 public:
  HAMBlock(const ModelConfig& c, int64_t layer, Generator& gen);
  HAMLayer::Output forward(const Tensor& x, const TokenBatch& batch,
                           const Tensor& previous_score) const;
  std::shared_ptr<RMSNorm> mixer_norm, mlp_norm;
  std::shared_ptr<HAMLayer> mixer;
  std::shared_ptr<SwiGLU> mlp;
};

class HAMModel : public DecoderLM {
 public:
  explicit HAMModel(const ModelConfig& config);
  Tensor hidden_states(const TokenBatch& batch) const override;
  // Per layer: kv fraction of the last forward (mean over sequences) and tau.
  std::vector<LayerRouting> routing() const override;
  // Algorithm 2 (learned tau only): apply the synthetic gradients of the training forwards
  // since the last step, unless step <= tau_freeze_steps.
  void after_optimizer_step(int64_t step) override;

  // Learned thresholds for checkpoints: ("layers.<i>.mixer.p_tau", [1] f32) per layer;
  // empty with fixed tau (the config is then the threshold's only source, so a checkpoint
  // never overrides a tau chosen at evaluation time).
  std::vector<std::pair<std::string, Tensor>> threshold_state() const;
  void load_threshold_state(const std::vector<std::pair<std::string, Tensor>>& values);
  // Checkpoint state beyond the parameters (learned tau only): threshold_state() plus the
  // threshold optimizer's moments ("threshold_optimizer.exp_avg.<p_tau name>", ...) and its
  // step count ("threshold_optimizer.steps", [1] i64).
  std::vector<std::pair<std::string, Tensor>> training_state() const override;
  void load_training_state(const std::vector<std::pair<std::string, Tensor>>& state) override;
  // The threshold optimizer (learned tau only; nullptr otherwise).
  ThresholdController* threshold_controller() { return thresholds_.get(); }
  const ThresholdController* threshold_controller() const { return thresholds_.get(); }
  // Cross-rank mean used by Algorithm 2 (identity by default; set by distributed training).
  void set_threshold_all_reduce(std::function<double(double)> all_reduce_mean);

  // Parameters the paper's table counts: the modules' plus 1 per layer for learned tau.
  int64_t table_parameter_count() const;

  std::vector<std::shared_ptr<HAMBlock>> layers;

 private:
  std::unique_ptr<ThresholdController> thresholds_;  // learned tau only
};

}  // namespace ham
