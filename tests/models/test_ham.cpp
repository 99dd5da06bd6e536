#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "models/ham.h"
#include "nn/attention.h"
#include "nn/optim.h"
#include "tests/models/model_testing.h"

namespace ham {
namespace {

// ---- Helpers --------------------------------------------------------------------------

enum class Variant { FixedTau, LearnedTau, ShallowRouter, DeepRouterEda };

ModelConfig tiny_config(Variant variant) {
  ModelConfig c;
  c.family = ModelFamily::HAM;
  c.vocab_size = 11;
  c.d_model = 8;
  c.n_layers = 2;
  c.d_ff = 12;
  c.gdn_heads = 1;  // RNN path: 1 head, K 4, V 6
  c.gdn_head_dim = 4;
  c.gdn_v_head_dim = 6;
  c.n_heads = 2;  // KV path: 2 heads, K 2, V 3 (same widths d_QK = 4, d_V = 6)
  c.n_kv_heads = 2;
  c.head_dim = 2;
  c.v_head_dim = 3;
  c.conv_size = 3;
  c.rope_base = 500000.0;
  c.init_std = 0.3;  // large enough that every path carries signal in the checks
  c.seed = 7;
  c.router_hidden = 5;
  c.router = RouterKind::FitError;
  c.tau = 1.0;
  switch (variant) {
    case Variant::FixedTau: break;
    case Variant::LearnedTau: c.learn_tau = true; break;
    case Variant::ShallowRouter:
      c.router = RouterKind::InputShallow;
      c.tau = 0.5;
      break;
    case Variant::DeepRouterEda:
      c.router = RouterKind::InputDeep;
      c.eda = true;
      c.tau = 0.5;
      break;
  }
  return c;
}

HAMLayer& mixer(HAMModel& model, size_t layer) { return *model.layers[layer]->mixer; }

// Smallest |e_t - tau_l| over every token and layer of the last forward.
double selection_margin(HAMModel& model) {
  double margin = INFINITY;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    double tau = mixer(model, l).threshold.tau();
    for (double e : mixer(model, l).last_trace().score.to_vector<double>()) {
      margin = std::min(margin, std::abs(e - tau));
    }
  }
  return margin;
}

// Sets each layer's tau in the middle of the widest gap between its scores that leaves
// between a quarter and three quarters of the tokens selected, so finite differences
// cannot flip a selection. Layer l's scores depend only on the thresholds below it, so
// the layers are placed in order.
void place_thresholds_between_scores(HAMModel& model, const TokenBatch& batch) {
  NoGradGuard no_grad;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    model.forward(batch);
    std::vector<double> e = mixer(model, l).last_trace().score.to_vector<double>();
    std::sort(e.begin(), e.end());
    size_t n = e.size(), best = n / 2;
    double widest = -1;
    for (size_t i = n / 4; i + 1 < n && i < 3 * n / 4; ++i) {
      if (e[i + 1] - e[i] > widest) {
        widest = e[i + 1] - e[i];
        best = i;
      }
    }
    ASSERT_GT(widest, 1e-3) << "layer " << l << ": scores too close together to place tau";
    mixer(model, l).threshold.set_tau(0.5 * (e[best] + e[best + 1]));
  }
  model.forward(batch);
}

// The KV output is RMS-normalised per head, so a value scale shared by every visible key
// cancels: the router learns only from score differences between tokens. Router weights
// of std 1 spread the scores over (0, 1), so its gradient stands well above the
// finite-difference noise.
void spread_router_scores(HAMModel& model) {
  uint64_t seed = 100;
  for (auto& [name, p] : model.named_parameters()) {
    if (name.find(".router.") == std::string::npos) continue;
    Tensor weights = p;
    weights.copy_(testing::randn64(p.shape(), seed++, 1.0, /*grad=*/false));
  }
}

void expect_whole_model_gradcheck(Variant variant) {
  ModelConfig c = tiny_config(variant);
  HAMModel model(c);
  model.to(DType::F64);
  spread_router_scores(model);
  TokenBatch batch = testing::packed_batch(2, 6, c.vocab_size, /*packed=*/true, /*curve=*/1);
  place_thresholds_between_scores(model, batch);
  // The selection is a hard threshold: fail loudly if a score sits near tau.
  double margin = selection_margin(model);
  ASSERT_GT(margin, 1e-5) << "a routing score lies within 1e-5 of tau; the check is invalid";
  for (const LayerRouting& r : model.routing()) {
    ASSERT_GT(r.kv_fraction, 0.0) << "layer " << r.layer << " selects nothing";
    ASSERT_LT(r.kv_fraction, 1.0) << "layer " << r.layer << " selects everything";
  }
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) {
    params.push_back(p);
    names.push_back(name);
  }
  // Every perturbed forward must select exactly the tokens the unperturbed one did.
  std::vector<std::vector<uint8_t>> base_selection;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    base_selection.push_back(mixer(model, l).last_trace().select.to_vector<uint8_t>());
  }
  int64_t forwards = 0, flipped = 0;
  double smallest_margin = INFINITY;
  auto loss = [&] {
    Tensor value = model.loss(batch);
    ++forwards;
    smallest_margin = std::min(smallest_margin, selection_margin(model));
    for (size_t l = 0; l < model.layers.size(); ++l) {
      if (mixer(model, l).last_trace().select.to_vector<uint8_t>() != base_selection[l]) ++flipped;
    }
    return value;
  };
  // eps 1e-5: the analytic gradients agree to ~5e-8; the error grows as 1/eps below that
  // (round-off of the central difference on a loss of ~2.4), e.g. 6e-7 at eps 1e-6.
  GradcheckOptions options;
  options.eps = 1e-5;
  GradcheckResult r = gradcheck_parameters(loss, params, names, options);
  EXPECT_TRUE(r.passed) << r.summary();
  EXPECT_LT(r.worst_relative_error, 1e-6) << r.summary();
  EXPECT_EQ(flipped, 0) << "finite differences flipped a selection; the check is invalid";
  EXPECT_GT(smallest_margin, 1e-5);
  std::printf("[ HAM gradcheck ] %s%s: worst relative error %.3e over %zu tensors; "
              "%lld forwards, smallest |e - tau| %.3e\n",
              router_name(c.router), c.learn_tau ? " (learned tau)" : (c.eda ? " + EDA" : ""),
              r.worst_relative_error, params.size(), (long long)forwards, smallest_margin);
}

// A fixed byte-level text for the training runs (no files needed).
std::vector<int64_t> training_bytes() {
  std::string text;
  const char* sentences[] = {
      "The quick brown fox jumps over the lazy dog. ",
      "A hybrid memory keeps a compressed state and a small cache of surprising tokens. ",
      "Key 7341 maps to value 2290, and key 5512 maps to value 8043. ",
      "The grass is green. The sky is blue. The sun is yellow. Here we go. ",
      "Recurrent networks summarise; attention remembers every detail it keeps. "};
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) text += sentences[rng() % 5];
  return std::vector<int64_t>(text.begin(), text.end());
}

TokenBatch sample_batch(const std::vector<int64_t>& data, int64_t B, int64_t T,
                        std::mt19937_64& rng) {
  std::vector<int64_t> ids, targets;
  std::uniform_int_distribution<size_t> start(0, data.size() - size_t(T) - 2);
  for (int64_t b = 0; b < B; ++b) {
    size_t s = start(rng);
    for (int64_t t = 0; t < T; ++t) {
      ids.push_back(data[s + size_t(t)]);
      targets.push_back(data[s + size_t(t) + 1]);
    }
  }
  return {Tensor::from_vector(ids, {B, T}), Tensor::from_vector(targets, {B, T}), {}, {}};
}

ModelConfig small_trainable_config() {
  ModelConfig c;
  c.family = ModelFamily::HAM;
  c.vocab_size = 257;
  c.d_model = 16;
  c.n_layers = 2;
  c.d_ff = 32;
  c.gdn_heads = 2;
  c.gdn_head_dim = 8;
  c.gdn_v_head_dim = 8;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.v_head_dim = 8;
  c.learn_tau = true;
  c.tau = 1.0;
  c.kv_target = {0.5};
  return c;
}

// The trainer's loop (forward, backward, clip, AdamW with warmup + cosine decay, then the
// model's hook), run here because this test binary does not link train/.
std::vector<std::vector<LayerRouting>> train_steps(HAMModel& model, int64_t steps,
                                                   const std::function<void(int64_t)>& after_step = {}) {
  std::vector<int64_t> data = training_bytes();
  std::mt19937_64 rng(11);
  AdamW optimizer(decay_groups(model.named_parameters(), 0.1), {3e-3, 0.9, 0.95, 1e-8});
  CosineSchedule schedule{3e-3, 3e-4, 20, steps};
  std::vector<std::vector<LayerRouting>> history;
  for (int64_t step = 1; step <= steps; ++step) {
    TokenBatch batch = sample_batch(data, 4, 32, rng);
    backward(model.loss(batch));
    clip_grad_norm(model.parameters(), 1.0);
    optimizer.step(schedule.lr(step - 1));
    optimizer.zero_grad();
    history.push_back(model.routing());
    model.after_optimizer_step(step);
    if (after_step) after_step(step);
  }
  return history;
}

// ---- Gradients ------------------------------------------------------------------------

TEST(HAM, WholeModelGradcheckF64FixedTau) { expect_whole_model_gradcheck(Variant::FixedTau); }
TEST(HAM, WholeModelGradcheckF64LearnedTau) { expect_whole_model_gradcheck(Variant::LearnedTau); }
TEST(HAM, WholeModelGradcheckF64ShallowRouter) {
  expect_whole_model_gradcheck(Variant::ShallowRouter);
}
TEST(HAM, WholeModelGradcheckF64DeepRouterWithEda) {
  expect_whole_model_gradcheck(Variant::DeepRouterEda);
}

TEST(HAM, RecomputeGivesIdenticalGradients) {
  ModelConfig c = tiny_config(Variant::DeepRouterEda);  // the score crosses checkpoints too
  TokenBatch batch = testing::packed_batch(2, 6, c.vocab_size, true, /*curve=*/1);
  HAMModel plain(c);
  c.recompute = true;
  HAMModel recomputed(c);
  plain.to(DType::F64);
  recomputed.to(DType::F64);
  testing::expect_same_gradients(plain, recomputed, batch);
}

TEST(HAMRouter, LearnedRouterLearnsThroughValueScaling) {
  HAMModel model(tiny_config(Variant::ShallowRouter));
  model.to(DType::F64);
  spread_router_scores(model);
  TokenBatch batch = testing::packed_batch(2, 6, 11, true, /*curve=*/1);
  place_thresholds_between_scores(model, batch);
  backward(model.loss(batch));
  for (size_t l = 0; l < 2; ++l) {
    Tensor w = mixer(model, l).router->proj->weight;
    ASSERT_TRUE(grad(w).defined());
    double norm = 0;
    for (double g : grad(w).to_vector<double>()) norm += g * g;
    EXPECT_GT(std::sqrt(norm), 1e-8) << "layer " << l;
  }
  // With nothing selected the value scale touches no key, so the router learns nothing.
  for (size_t l = 0; l < 2; ++l) mixer(model, l).threshold.set_tau(1.0 - 1e-9);
  model.zero_grad();
  backward(model.loss(batch));
  Tensor g = grad(mixer(model, 0).router->proj->weight);
  if (g.defined()) {
    for (double v : g.to_vector<double>()) EXPECT_EQ(v, 0.0);
  }
}

TEST(HAMRouter, FitErrorRouterHasNoWeights) {
  HAMModel model(tiny_config(Variant::FixedTau));
  for (const auto& [name, p] : model.named_parameters()) {
    EXPECT_EQ(name.find("router"), std::string::npos) << name;
    EXPECT_EQ(name.find("eda"), std::string::npos) << name;
  }
  EXPECT_EQ(mixer(model, 0).router, nullptr);
}

TEST(HAMRouter, EdaMixesWithThePreviousLayer) {
  ModelConfig c = tiny_config(Variant::DeepRouterEda);
  HAMModel model(c);
  model.to(DType::F64);
  EXPECT_EQ(mixer(model, 0).eda, nullptr);  // nothing to average with at layer 0
  ASSERT_NE(mixer(model, 1).eda, nullptr);
  EXPECT_DOUBLE_EQ(mixer(model, 1).eda->gamma(), 0.5);
  TokenBatch batch = testing::packed_batch(2, 6, 11, true, /*curve=*/1);
  model.forward(batch);
  // e^1 = 0.5 sigmoid(MLP_1(x^1)) + 0.5 e^0.
  std::vector<double> e0 = mixer(model, 0).last_trace().score.to_vector<double>();
  std::vector<double> e1 = mixer(model, 1).last_trace().score.to_vector<double>();
  // Recover layer 1's own score by running its router on its (normed) input.
  NoGradGuard no_grad;
  Tensor x = model.embed->forward(batch.inputs);
  x = model.layers[0]->forward(x, batch, Tensor()).out;
  Tensor own = mixer(model, 1).router->forward(model.layers[1]->mixer_norm->forward(x));
  std::vector<double> own_scores = own.to_vector<double>();
  for (size_t i = 0; i < e1.size(); ++i) {
    EXPECT_NEAR(e1[i], 0.5 * own_scores[i] + 0.5 * e0[i], 1e-12);
  }
}

TEST(HAMRouter, EdaNeedsALearnedRouter) {
  ModelConfig c = tiny_config(Variant::FixedTau);
  c.eda = true;
  EXPECT_THROW({ HAMModel model(c); }, Error);
}

TEST(HAMRouter, HeadAggregationIsMinOrMax) {
  Tensor per_head = Tensor::from_vector(std::vector<double>{0.3, 1.7, 0.9, 0.2, 0.4, 1.1}, {1, 2, 3});
  EXPECT_EQ(aggregate_head_scores(per_head, HeadAggregate::Min).to_vector<double>(),
            (std::vector<double>{0.3, 0.2}));
  EXPECT_EQ(aggregate_head_scores(per_head, HeadAggregate::Max).to_vector<double>(),
            (std::vector<double>{1.7, 1.1}));
}

// ---- Selection semantics --------------------------------------------------------------

TEST(HAM, FitErrorIsOneAtEachDocumentsFirstToken) {
  for (HeadAggregate agg : {HeadAggregate::Min, HeadAggregate::Max}) {
    ModelConfig c = tiny_config(Variant::FixedTau);
    c.gdn_heads = 2;  // several heads, so min and max differ elsewhere
    c.gdn_head_dim = 2;
    c.gdn_v_head_dim = 3;
    c.router_aggregate = agg;
    HAMModel model(c);
    model.to(DType::F64);
    TokenBatch batch = testing::packed_batch(2, 8, 11, true, /*curve=*/1);
    model.forward(batch);
    for (size_t l = 0; l < 2; ++l) {
      std::vector<double> e = mixer(model, l).last_trace().score.to_vector<double>();
      for (int64_t b = 0; b < 2; ++b) {
        EXPECT_DOUBLE_EQ(e[size_t(b * 8 + 0)], 1.0) << "layer " << l;
        EXPECT_DOUBLE_EQ(e[size_t(b * 8 + 4)], 1.0) << "layer " << l;  // second document
        EXPECT_NE(e[size_t(b * 8 + 2)], 1.0);
      }
      for (double v : e) {
        EXPECT_GE(v, 0.0);
        EXPECT_LE(v, 2.0);
      }
    }
  }
}

TEST(HAM, TauAboveEveryScoreSelectsNothing) {
  ModelConfig c = tiny_config(Variant::FixedTau);
  HAMModel model(c);
  model.to(DType::F64);
  for (size_t l = 0; l < 2; ++l) {
    mixer(model, l).threshold.set_tau(2.0 - 1e-9);
    mixer(model, l).keep_path_outputs = true;
  }
  TokenBatch batch = testing::packed_batch(2, 6, 11, true, /*curve=*/1);
  Tensor logits = model.forward(batch);
  for (double v : logits.to_vector<double>()) ASSERT_TRUE(std::isfinite(v));
  for (size_t l = 0; l < 2; ++l) {
    const HAMLayerTrace& trace = mixer(model, l).last_trace();
    for (double e : trace.score.to_vector<double>()) ASSERT_LT(e, mixer(model, l).threshold.tau());
    EXPECT_EQ(model.routing()[l].kv_fraction, 0.0);
    for (double v : trace.kv_output.to_vector<double>()) EXPECT_EQ(v, 0.0);
  }
  // The KV path contributes nothing: its weights get zero gradient and changing them
  // leaves the logits as they were.
  backward(model.loss(batch));
  for (const auto& [name, p] : model.named_parameters()) {
    bool kv_path = name.find("mixer.kv.") != std::string::npos ||
                   name.find("kv_gate") != std::string::npos ||
                   name.find("kv_out_norm") != std::string::npos;
    if (!kv_path) continue;
    Tensor g = grad(p);
    if (g.defined()) {
      for (double v : g.to_vector<double>()) EXPECT_EQ(v, 0.0) << name;
    }
    Tensor weights = p;
    weights.fill_(0.25);
  }
  EXPECT_EQ(model.forward(batch).to_vector<double>(), logits.to_vector<double>());
}

TEST(HAM, TauBelowEveryScoreIsDenseCausalAttention) {
  ModelConfig c = tiny_config(Variant::FixedTau);
  HAMModel model(c);
  model.to(DType::F64);
  for (size_t l = 0; l < 2; ++l) {
    mixer(model, l).threshold.set_tau(1e-9);
    mixer(model, l).keep_path_outputs = true;
  }
  TokenBatch batch = testing::packed_batch(2, 6, 11, true, /*curve=*/1);
  model.forward(batch);
  for (size_t l = 0; l < 2; ++l) {
    const HAMLayerTrace& trace = mixer(model, l).last_trace();
    for (double e : trace.score.to_vector<double>()) ASSERT_GE(e, mixer(model, l).threshold.tau());
    EXPECT_EQ(model.routing()[l].kv_fraction, 1.0);
    Tensor dense = causal_attention(trace.kv_q, trace.kv_k, trace.kv_v,
                                    1.0 / std::sqrt(double(c.head_dim)), batch.doc_ids);
    EXPECT_LT(testing::max_abs_diff(trace.kv_output, dense), 1e-12) << "layer " << l;
  }
}

TEST(HAM, PackedDocumentsDoNotSeeEachOther) {
  // The second document's logits and routing equal those of its tokens run on their own.
  for (Variant variant : {Variant::FixedTau, Variant::DeepRouterEda}) {
    HAMModel model(tiny_config(variant));
    model.to(DType::F64);
    TokenBatch packed = testing::packed_batch(1, 8, 11, true, /*curve=*/1);
    Tensor logits = model.forward(packed);
    std::vector<double> packed_score = mixer(model, 1).last_trace().score.to_vector<double>();
    std::vector<int64_t> ids = packed.inputs.to_vector<int64_t>();
    std::vector<int64_t> second(ids.begin() + 4, ids.end());
    TokenBatch alone{Tensor::from_vector(second, {1, 4}), Tensor::from_vector(second, {1, 4}), {}, {}};
    Tensor alone_logits = model.forward(alone);
    std::vector<double> alone_score = mixer(model, 1).last_trace().score.to_vector<double>();
    auto full = logits.to_vector<double>(), solo = alone_logits.to_vector<double>();
    for (size_t i = 0; i < solo.size(); ++i) EXPECT_NEAR(full[4 * 11 + i], solo[i], 1e-12);
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(packed_score[4 + i], alone_score[i], 1e-12);
  }
}

// ---- Parameter counts -----------------------------------------------------------------

// The paper's table (tab:params_ham), Layer Total, written out independently of the model.
int64_t paper_layer_total(const ModelConfig& c, bool learned_tau, bool learned_router) {
  int64_t d = c.d_model, d_qk = c.gdn_heads * c.gdn_head_dim, d_v = c.gdn_heads * c.gdn_v_head_dim;
  int64_t h_rnn = c.gdn_heads, h_kv = c.n_heads;
  return (d + 2 * c.conv_size + 2) * (2 * d_qk + d_v) + d * (3 * h_rnn + h_kv + 2 * d_v + 1) +
         2 * h_rnn + c.gdn_v_head_dim + c.v_head_dim + (learned_tau ? 1 : 0) +
         (learned_router ? d : 0);
}

ModelConfig paper_800m_config() {
  ModelConfig c;
  c.family = ModelFamily::HAM;
  c.vocab_size = 32000;
  c.d_model = 1792;
  c.n_layers = 24;
  c.d_ff = 2560;
  c.conv_size = 4;
  c.gdn_heads = 5;
  c.gdn_head_dim = 256;
  c.gdn_v_head_dim = 384;
  c.n_heads = 10;
  c.n_kv_heads = 10;
  c.head_dim = 128;
  c.v_head_dim = 192;
  c.rope_base = 500000.0;
  c.router = RouterKind::FitError;
  c.tau = 1.0;
  return c;
}

TEST(HAM, PaperParameterCount805M) {
  SkipInitGuard skip_init;
  ModelConfig c = paper_800m_config();
  {
    HAMModel model(c);
    EXPECT_EQ(model.num_parameters(), 805068272);
    EXPECT_EQ(model.table_parameter_count(), 805068272);
    EXPECT_EQ(model.layers[0]->mixer_norm->weight.numel() + model.layers[0]->mixer->num_parameters(),
              paper_layer_total(c, false, false));
  }
  // Learned thresholds add one per layer to the table, none to the module parameters.
  c.learn_tau = true;
  HAMModel learned(c);
  EXPECT_EQ(learned.num_parameters(), 805068272);
  EXPECT_EQ(learned.table_parameter_count(), 805068272 + 24);
}

TEST(HAM, PerLayerParameterCountMatchesTable) {
  for (Variant variant : {Variant::FixedTau, Variant::LearnedTau, Variant::ShallowRouter,
                          Variant::DeepRouterEda}) {
    ModelConfig c = tiny_config(variant);
    HAMModel model(c);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const HAMBlock& block = *model.layers[size_t(l)];
      int64_t layer_params = block.mixer_norm->weight.numel() + block.mixer->num_parameters() +
                             (c.learn_tau ? 1 : 0);
      int64_t expected = paper_layer_total(c, c.learn_tau, c.router == RouterKind::InputShallow);
      if (c.router == RouterKind::InputDeep) {
        // Not in the table: 3 bias-free linears d -> h -> h -> 1, plus EDA's gamma (l >= 1).
        int64_t h = c.router_hidden;
        expected += c.d_model * h + h * h + h + (l > 0 ? 1 : 0);
      }
      EXPECT_EQ(layer_params, expected) << router_name(c.router) << " layer " << l;
      EXPECT_EQ(HAMLayer::table_parameter_count(c, l), expected);
    }
    int64_t ffn = c.d_model + 3 * c.d_model * c.d_ff;
    int64_t embeddings = 2 * c.vocab_size * c.d_model + c.d_model;
    int64_t layers_total = 0;
    for (int64_t l = 0; l < c.n_layers; ++l) layers_total += HAMLayer::table_parameter_count(c, l);
    EXPECT_EQ(model.table_parameter_count(), layers_total + c.n_layers * ffn + embeddings);
  }
}

TEST(HAM, ParameterNames) {
  HAMModel model(tiny_config(Variant::ShallowRouter));
  for (const char* name :
       {"layers.0.mixer_norm.weight", "layers.0.mixer.q_proj.weight", "layers.0.mixer.k_proj.weight",
        "layers.0.mixer.v_proj.weight", "layers.0.mixer.rnn.q_conv.weight",
        "layers.0.mixer.rnn.v_norm.weight", "layers.0.mixer.kv.k_conv.weight",
        "layers.0.mixer.kv.q_norm.weight", "layers.0.mixer.a_proj.weight",
        "layers.0.mixer.b_proj.weight", "layers.0.mixer.A_log", "layers.0.mixer.dt_bias",
        "layers.0.mixer.gate_proj.weight", "layers.0.mixer.rnn_out_norm.weight",
        "layers.0.mixer.kv_out_norm.weight", "layers.0.mixer.rnn_gate.weight",
        "layers.0.mixer.kv_gate.weight", "layers.0.mixer.o_proj.weight",
        "layers.0.mixer.router.proj.weight", "layers.1.mlp.down.weight", "lm_head.weight"}) {
    EXPECT_NO_THROW(model.parameter(name)) << name;
  }
  EXPECT_THROW(model.parameter("layers.0.mixer.p_tau"), Error);  // not a parameter
}

TEST(HAM, TinyConfigsBuildAndRun) {
  struct Expected {
    const char* file;
    RouterKind router;
    bool learn_tau, eda;
  };
  for (const Expected& e : {Expected{"ham-fixed-tau.json", RouterKind::FitError, false, false},
                            Expected{"ham-learned-tau.json", RouterKind::FitError, true, false},
                            Expected{"ham-learned-router.json", RouterKind::InputDeep, true, false},
                            Expected{"ham-learned-router-eda.json", RouterKind::InputDeep, true, true}}) {
    ModelConfig c = ModelConfig::from_file(std::string(HAM_SOURCE_DIR) + "/configs/tiny/" + e.file);
    EXPECT_EQ(c.family, ModelFamily::HAM) << e.file;
    EXPECT_EQ(c.router, e.router) << e.file;
    EXPECT_EQ(c.learn_tau, e.learn_tau) << e.file;
    EXPECT_EQ(c.eda, e.eda) << e.file;
    EXPECT_EQ(c.vocab_size, 257) << e.file;
    if (c.learn_tau) {
      EXPECT_EQ(c.kv_target_for_layer(1), 0.5) << e.file;
    }
    HAMModel model(c);
    TokenBatch batch = testing::packed_batch(1, 16, c.vocab_size, true, /*curve=*/1);
    Tensor loss = model.loss(batch);
    EXPECT_TRUE(std::isfinite(loss.item())) << e.file;
    backward(loss);
    EXPECT_EQ(model.routing().size(), size_t(c.n_layers));
  }
}

// ---- Thresholds (Algorithm 2) ---------------------------------------------------------

TEST(HAMThreshold, TauIsScaledSigmoidOfLogit) {
  Threshold cosine(1.5, 2.0);
  EXPECT_NEAR(cosine.tau(), 1.5, 1e-6);
  EXPECT_NEAR(cosine.p_tau().to_vector<double>()[0], std::log(0.75 / 0.25), 1e-6);
  Threshold learned(0.5, 1.0);
  EXPECT_NEAR(learned.p_tau().to_vector<double>()[0], 0.0, 1e-7);
  EXPECT_FALSE(requires_grad(learned.p_tau()));
  EXPECT_THROW(learned.set_tau(1.0), Error);
  ModelConfig c = tiny_config(Variant::FixedTau);
  EXPECT_DOUBLE_EQ(c.tau_scale(), 2.0);
  c.router = RouterKind::InputShallow;
  EXPECT_DOUBLE_EQ(c.tau_scale(), 1.0);
}

TEST(HAMThreshold, SyntheticGradientSignClipAndAllReduce) {
  EXPECT_DOUBLE_EQ(ThresholdController::synthetic_gradient(0.2, 2.0, 1.0), -0.4);
  EXPECT_DOUBLE_EQ(ThresholdController::synthetic_gradient(0.9, 2.0, 1.0), -1.0);
  EXPECT_DOUBLE_EQ(ThresholdController::synthetic_gradient(-0.9, 2.0, 0.5), 0.5);

  Threshold threshold(1.0, 2.0);
  ThresholdController controller({{"p", threshold.p_tau()}}, {{0.5}, 1.0, 1.0, 0.1, 0});
  // Too many tokens selected (0.75 and 1.0 against 0.5): tau rises by one AdamW step (lr).
  controller.record_forward({{0.75, 1.0}});
  EXPECT_NEAR(controller.pending_gaps()[0][0], 0.375, 1e-15);
  double before = threshold.p_tau().to_vector<double>()[0];
  EXPECT_TRUE(controller.after_optimizer_step(1));
  double after = threshold.p_tau().to_vector<double>()[0];
  EXPECT_NEAR(after - before, 0.1, 1e-6);
  EXPECT_TRUE(controller.pending_gaps().empty());
  // The cross-rank mean decides: the other ranks select too few, so tau falls.
  controller.all_reduce_mean = [](double local) { return local - 1.0; };
  controller.record_forward({{0.75, 1.0}});
  controller.after_optimizer_step(2);
  EXPECT_LT(threshold.p_tau().to_vector<double>()[0], after);
  // No forward since the last step: nothing moves.
  double now = threshold.p_tau().to_vector<double>()[0];
  EXPECT_FALSE(controller.after_optimizer_step(3));
  EXPECT_EQ(threshold.p_tau().to_vector<double>()[0], now);
}

TEST(HAMThreshold, FrozenDuringFreezeSteps) {
  ModelConfig c = small_trainable_config();
  c.tau_freeze_steps = 5;
  c.tau_lr = 0.05;
  HAMModel model(c);
  std::vector<double> p0;
  for (const auto& [name, p] : model.threshold_state()) p0.push_back(p.to_vector<double>()[0]);
  ASSERT_EQ(p0.size(), 2u);
  train_steps(model, 7, [&](int64_t step) {
    auto state = model.threshold_state();
    for (size_t l = 0; l < state.size(); ++l) {
      double p = state[l].second.to_vector<double>()[0];
      if (step <= 5) {
        EXPECT_EQ(p, p0[l]) << "layer " << l << " moved at step " << step;
      } else {
        EXPECT_NE(p, p0[l]) << "layer " << l << " did not move at step " << step;
      }
    }
  });
  EXPECT_EQ(model.threshold_controller()->optimizer().steps_taken(), 2);
}

TEST(HAMThreshold, LearnedThresholdReachesTargetKvFraction) {
  // The paper's threshold optimizer runs at lr 2.5e-4 for tens of thousands of steps; this
  // run has 200, so tau_lr = 0.05 and gain 4 (clip 1). The fit errors of so small a model
  // drift fast while it learns (layer 1's fall towards 0), so tau tracks a moving target;
  // the check is on the mean kv fraction of the last 30 steps. Chasing falling errors, tau
  // lags and layer 1 runs above the target: over ten batch seeds its mean was 0.505-0.558
  // (layer 0's 0.488-0.527), so the bound is 0.08. With tau frozen at 0.4 the fit errors'
  // fall takes the fractions to 0.31 and 0.03.
  ModelConfig c = small_trainable_config();
  c.tau_lr = 0.05;
  c.tau_gain = 4.0;
  c.tau = 0.4;  // starts away from the target
  HAMModel model(c);
  auto history = train_steps(model, 200);
  const size_t window = 30;
  std::string report;
  for (size_t l = 0; l < 2; ++l) {
    double first = history.front()[l].kv_fraction, mean = 0;
    for (size_t s = history.size() - window; s < history.size(); ++s) mean += history[s][l].kv_fraction;
    mean /= double(window);
    report += "layer " + std::to_string(l) + ": kv fraction " + std::to_string(first) + " -> " +
              std::to_string(mean) + " (tau " + std::to_string(history.front()[l].tau) + " -> " +
              std::to_string(history.back()[l].tau) + ")\n";
    EXPECT_NEAR(mean, 0.5, 0.08) << report;
  }
  std::printf("[ HAM tau ] %s", report.c_str());
}

TEST(HAMThreshold, PerLayerTargets) {
  ModelConfig c = small_trainable_config();
  c.router = RouterKind::InputShallow;
  c.tau = 0.5;
  c.kv_target = {0.25, 0.75};
  c.tau_lr = 0.05;
  c.tau_gain = 4.0;
  HAMModel model(c);
  auto history = train_steps(model, 200);
  for (size_t l = 0; l < 2; ++l) {
    double mean = 0;
    for (size_t s = history.size() - 30; s < history.size(); ++s) mean += history[s][l].kv_fraction;
    EXPECT_NEAR(mean / 30.0, c.kv_target[l], 0.05) << "layer " << l;
  }
}

TEST(HAMThreshold, EvaluationForwardsDoNotCount) {
  ModelConfig c = small_trainable_config();
  HAMModel model(c);
  TokenBatch batch = testing::packed_batch(2, 8, c.vocab_size, false, /*curve=*/1);
  {
    NoGradGuard no_grad;
    model.forward(batch);
  }
  EXPECT_TRUE(model.threshold_controller()->pending_gaps().empty());
  model.forward(batch);
  EXPECT_EQ(model.threshold_controller()->pending_gaps().size(), 1u);
}

TEST(HAMThreshold, TrainingStateRoundTrip) {
  ModelConfig c = small_trainable_config();
  c.tau_lr = 0.05;
  HAMModel model(c);
  train_steps(model, 3);
  auto state = model.training_state();
  HAMModel restored(c);
  restored.load_training_state(state);
  auto a = model.training_state(), b = restored.training_state();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.to_vector<double>(), b[i].second.to_vector<double>()) << a[i].first;
  }
  EXPECT_EQ(restored.threshold_controller()->optimizer().steps_taken(), 3);
  EXPECT_EQ(restored.routing().size(), 2u);
  // Fixed tau keeps no state: the config is the threshold's only source.
  EXPECT_TRUE(HAMModel(tiny_config(Variant::FixedTau)).training_state().empty());
}

}  // namespace
}  // namespace ham
