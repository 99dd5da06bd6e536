// Decoding (models/decoding.h) against the full forward pass, for every tiny config.
//
// Logits are compared per feed with the norm-relative error max|a - b| / max|b| over that
// feed's [B, n, vocab] logits, which must stay below 1e-5 in f32: the decoder reorders
// sums (the per-token recurrence instead of chunks, attention over a cache) but computes
// the same function.
//
// HAM's selection [e_t >= tau] is a hard threshold: a score within rounding of tau could
// flip between the two computations without either being wrong. So each HAM layer's tau
// is placed in a wide gap between the full forward's scores (at least kMargin from every
// score, asserted), the decoder's scores must agree with the forward's to within
// kScoreTolerance << kMargin (asserted), and then the KV cache must hold exactly the
// tokens the forward selected.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/ops/shape.h"
#include "models/decoding.h"
#include "models/ham.h"
#include "tests/error_testing.h"
#include "tests/models/model_testing.h"

namespace ham {
namespace {

constexpr int64_t kBatch = 2;
constexpr int64_t kTokens = 40;
constexpr double kLogitTolerance = 1e-5;  // norm-relative, per feed, f32
constexpr double kF64LogitTolerance = 1e-11;
constexpr double kMargin = 1e-4;          // every score's distance from tau
constexpr double kScoreTolerance = 1e-5;  // |decoder score - forward score|

std::vector<std::string> tiny_config_paths() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(HAM_SOURCE_DIR "/configs/tiny")) {
    if (entry.path().extension() == ".json") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::string variant_name(const std::string& path) {
  std::string stem = std::filesystem::path(path).stem().string();
  std::replace(stem.begin(), stem.end(), '-', '_');
  return stem;
}

// Time steps [begin, begin + count) of x [B, T, ...].
Tensor time_rows(const Tensor& x, int64_t begin, int64_t count) {
  if (begin == 0 && count == x.size(1)) return x;
  std::vector<int64_t> sizes;
  if (begin > 0) sizes.push_back(begin);
  sizes.push_back(count);
  if (begin + count < x.size(1)) sizes.push_back(x.size(1) - begin - count);
  return ops::split(x, sizes, 1)[begin > 0 ? 1 : 0];
}

double relative_error(const Tensor& a, const Tensor& b) {
  std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    diff = std::max(diff, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return diff / scale;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  double diff = 0;
  for (size_t i = 0; i < va.size(); ++i) diff = std::max(diff, std::abs(va[i] - vb[i]));
  return diff;
}

TokenBatch random_batch(int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  return {randint({kBatch, kTokens}, gen, 0, vocab), Tensor(), Tensor(), Tensor()};
}

// At init_std 0.02 the deep router's scores all sit within ~1e-3 of 0.5; weights of std
// 1/sqrt(fan_in) spread them over (0, 1) so that tau can be placed between them.
void spread_router_scores(LanguageModel& model) {
  Generator gen(99);
  for (auto& [name, p] : model.named_parameters()) {
    if (name.find(".router.") == std::string::npos || p.dim() != 2) continue;
    Tensor weights = p;
    weights.copy_(normal(p.shape(), gen, 0.0, 1.0 / std::sqrt(double(p.size(1))), p.dtype()));
  }
}

// Sets each HAM layer's tau in the middle of the widest gap between its forward scores
// near the point where `fraction` of them pass, layer by layer (a layer's scores depend
// on the taus below it). `taus` gets the midpoints (the model stores tau as an f32 logit,
// so its own tau differs from these in the last bits; kMargin covers that).
void place_taus(HAMModel& model, const TokenBatch& batch, double fraction,
                std::vector<double>& taus) {
  NoGradGuard no_grad;
  taus.clear();
  for (size_t l = 0; l < model.layers.size(); ++l) {
    model.forward(batch);
    std::vector<double> e = model.layers[l]->mixer->last_trace().score.to_vector<double>();
    std::sort(e.begin(), e.end(), std::greater<>());
    const int64_t n = int64_t(e.size()), target = std::llround(fraction * double(n));
    int64_t best = -1;
    double widest = 0;
    for (int64_t i = std::max<int64_t>(1, target - n / 8); i <= std::min(n - 1, target + n / 8); ++i) {
      if (e[size_t(i - 1)] - e[size_t(i)] > widest) {
        widest = e[size_t(i - 1)] - e[size_t(i)];
        best = i;
      }
    }
    ASSERT_GT(widest, 4 * kMargin) << "layer " << l << ": scores too close together to place tau";
    taus.push_back(0.5 * (e[size_t(best - 1)] + e[size_t(best)]));
    model.layers[l]->mixer->threshold.set_tau(taus.back());
  }
}

// What the full forward did on the whole batch; causal, so position t's logits and
// selection are those of the prefix [0, t].
struct Reference {
  Tensor logits;                          // [B, T, vocab]
  std::vector<Tensor> scores;             // HAM: [B, T] per layer
  std::vector<std::vector<int64_t>> selected;  // HAM: [B * T] 0/1 per layer
};

Reference reference_forward(const LanguageModel& model, const TokenBatch& batch) {
  NoGradGuard no_grad;
  Reference r;
  r.logits = model.forward(batch);
  if (const auto* ham = dynamic_cast<const HAMModel*>(&model)) {
    for (const auto& layer : ham->layers) {
      r.scores.push_back(layer->mixer->last_trace().score);
      r.selected.push_back(layer->mixer->last_trace().select.to_vector<int64_t>());
    }
  }
  return r;
}

// Cached tokens per row after `fed` tokens that each layer must hold: every token for
// attention layers, the selected ones for HAM, none for GDN.
std::vector<int64_t> expected_cache(const LanguageModel& model, const Reference& ref,
                                    int64_t layer, int64_t fed) {
  const ModelConfig& c = model.config();
  if (c.family == ModelFamily::HAM) {
    std::vector<int64_t> counts(kBatch, 0);
    for (int64_t b = 0; b < kBatch; ++b) {
      for (int64_t t = 0; t < fed; ++t) counts[size_t(b)] += ref.selected[size_t(layer)][size_t(b * kTokens + t)];
    }
    return counts;
  }
  bool attention = c.family == ModelFamily::Transformer ||
                   (c.family == ModelFamily::GDNGSA && c.is_attention_layer(layer));
  return attention ? std::vector<int64_t>(kBatch, fed) : std::vector<int64_t>{};
}

// Feeds the batch in pieces of `sizes` tokens and checks each feed's logits, scores and
// KV cache lengths against the reference.
void expect_decoding_matches(const LanguageModel& model, const TokenBatch& batch,
                             const Reference& ref, const std::vector<int64_t>& sizes,
                             const RoutingOverride& routing, const std::string& label,
                             double tolerance) {
  Decoder decoder(model, kBatch, routing);
  int64_t fed = 0;
  for (int64_t n : sizes) {
    SCOPED_TRACE(label + ": feed of " + std::to_string(n) + " at position " + std::to_string(fed));
    Tensor logits = decoder.feed(time_rows(batch.inputs, fed, n));
    ASSERT_EQ(logits.shape(), Shape({kBatch, n, model.config().vocab_size}));
    EXPECT_LT(relative_error(logits, time_rows(ref.logits, fed, n)), tolerance);
    for (size_t l = 0; l < ref.scores.size(); ++l) {
      EXPECT_LT(max_abs_diff(decoder.last_scores(int64_t(l)), time_rows(ref.scores[l], fed, n)),
                kScoreTolerance)
          << "layer " << l;
    }
    fed += n;
    EXPECT_EQ(decoder.position(), fed);
    for (int64_t l = 0; l < decoder.num_layers(); ++l) {
      EXPECT_EQ(decoder.kv_cache_tokens(l), expected_cache(model, ref, l, fed)) << "layer " << l;
    }
  }
  ASSERT_EQ(fed, kTokens);
}

std::vector<int64_t> prefill_then_single(int64_t prefill) {
  std::vector<int64_t> sizes = {prefill};
  sizes.resize(size_t(kTokens - prefill + 1), 1);
  return sizes;
}

// The three feeding schedules: a prompt then one token at a time, every token alone, and
// pieces of 7 (several tokens on top of carried state).
void expect_all_schedules_match(const LanguageModel& model, const TokenBatch& batch,
                                const RoutingOverride& override_for_single_tokens,
                                const std::string& label, double tolerance = kLogitTolerance) {
  Reference ref = reference_forward(model, batch);
  expect_decoding_matches(model, batch, ref, prefill_then_single(17), {}, label + ", prefill 17",
                          tolerance);
  expect_decoding_matches(model, batch, ref, std::vector<int64_t>(kTokens, 1),
                          override_for_single_tokens, label + ", one at a time", tolerance);
  expect_decoding_matches(model, batch, ref, {7, 7, 7, 7, 7, 5}, {}, label + ", pieces of 7",
                          tolerance);
}

// Smallest |e - tau| over every token and HAM layer of the reference, for both the
// model's stored tau and the placed midpoints.
double selection_margin(const HAMModel& model, const Reference& ref, const std::vector<double>& taus) {
  double margin = INFINITY;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    for (double e : ref.scores[l].to_vector<double>()) {
      margin = std::min({margin, std::abs(e - model.layers[l]->mixer->threshold.tau()),
                         std::abs(e - taus[l])});
    }
  }
  return margin;
}

class DecodingMatchesForward : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodingMatchesForward, LogitsAndCachesEqualTheFullForward) {
  ModelConfig c = ModelConfig::from_file(GetParam());
  std::shared_ptr<LanguageModel> model = make_model(c);
  TokenBatch batch = random_batch(c.vocab_size, 1234);
  auto* ham_model = dynamic_cast<HAMModel*>(model.get());
  if (!ham_model) {
    expect_all_schedules_match(*model, batch, {}, variant_name(GetParam()));
    return;
  }
  spread_router_scores(*model);
  for (double fraction : {0.5, 0.25}) {
    std::vector<double> taus;
    place_taus(*ham_model, batch, fraction, taus);
    if (HasFatalFailure()) return;
    Reference ref = reference_forward(*model, batch);
    ASSERT_GT(selection_margin(*ham_model, ref, taus), kMargin);
    // Single tokens with the placed taus given as an override instead of read from the model.
    RoutingOverride per_layer;
    for (size_t l = 0; l < taus.size(); ++l) per_layer.layer_tau[int64_t(l)] = taus[l];
    expect_all_schedules_match(*model, batch, per_layer,
                               variant_name(GetParam()) + ", kv fraction ~" + std::to_string(fraction));
  }
}

INSTANTIATE_TEST_SUITE_P(TinyConfigs, DecodingMatchesForward, ::testing::ValuesIn(tiny_config_paths()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return variant_name(info.param);
                         });

std::shared_ptr<LanguageModel> tiny_model(const std::string& variant) {
  return make_model(ModelConfig::from_file(HAM_SOURCE_DIR "/configs/tiny/" + variant + ".json"));
}

// In f64 the same comparison is exact to ~1e-15: the f32 differences above are rounding.
TEST(Decoding, F64ModelsMatchTheFullForwardToRounding) {
  for (const char* variant : {"gdn-gsa", "ham-learned-router-eda"}) {
    std::shared_ptr<LanguageModel> model = tiny_model(variant);
    model->to(DType::F64);
    TokenBatch batch = random_batch(model->config().vocab_size, 77);
    RoutingOverride none;
    if (auto* ham_model = dynamic_cast<HAMModel*>(model.get())) {
      spread_router_scores(*model);
      std::vector<double> taus;
      place_taus(*ham_model, batch, 0.5, taus);
      if (HasFatalFailure()) return;
      ASSERT_GT(selection_margin(*ham_model, reference_forward(*model, batch), taus), kMargin);
    }
    expect_all_schedules_match(*model, batch, none, std::string(variant) + " f64", kF64LogitTolerance);
  }
}

TEST(Decoding, KvFractionCalibratesEachLayerOnThePrompt) {
  std::shared_ptr<LanguageModel> model = tiny_model("ham-fixed-tau");
  TokenBatch batch = random_batch(model->config().vocab_size, 5);
  RoutingOverride routing;
  routing.kv_fraction = 0.25;
  Decoder decoder(*model, kBatch, routing);
  decoder.feed(batch.inputs);
  for (const LayerCacheStats& s : decoder.layer_stats()) {
    // round(0.25 * 80) of the prompt's scores pass (fit errors of distinct tokens do not tie).
    ASSERT_EQ(s.kv_tokens.size(), size_t(kBatch));
    EXPECT_EQ(s.kv_tokens[0] + s.kv_tokens[1], 20) << "layer " << s.layer;
    ASSERT_TRUE(s.tau.has_value());
    std::vector<double> e = decoder.last_scores(s.layer).to_vector<double>();
    EXPECT_EQ(std::count_if(e.begin(), e.end(), [&](double x) { return x >= *s.tau; }), 20);
  }
}

TEST(Decoding, TauOverrideChangesTheCache) {
  std::shared_ptr<LanguageModel> model = tiny_model("ham-fixed-tau");
  TokenBatch batch = random_batch(model->config().vocab_size, 6);
  RoutingOverride none, all, low;
  all.tau = -1.0;  // every score (>= 0) passes
  low.layer_tau[1] = 3.0;  // nothing passes at layer 1 (fit errors lie in [0, 2])
  Decoder every(*model, kBatch, all), layer1_empty(*model, kBatch, low);
  every.feed(batch.inputs);
  layer1_empty.feed(batch.inputs);
  EXPECT_EQ(every.kv_cache_tokens(0), std::vector<int64_t>(kBatch, kTokens));
  EXPECT_EQ(every.kv_cache_tokens(1), std::vector<int64_t>(kBatch, kTokens));
  EXPECT_EQ(layer1_empty.kv_cache_tokens(1), std::vector<int64_t>(kBatch, 0));
  EXPECT_EQ(*layer1_empty.layer_stats()[1].tau, 3.0);
  EXPECT_DOUBLE_EQ(*layer1_empty.layer_stats()[0].tau,
                   dynamic_cast<HAMModel&>(*model).layers[0]->mixer->threshold.tau());
}

TEST(Decoding, CacheBytesCountStateAndCachedTokens) {
  const int64_t f32 = 4;
  {
    std::shared_ptr<LanguageModel> model = tiny_model("transformer");
    const ModelConfig& c = model->config();
    Decoder decoder(*model, kBatch);
    decoder.feed(random_batch(c.vocab_size, 7).inputs);
    CacheBytes bytes = decoder.cache_bytes();
    EXPECT_EQ(bytes.kv, c.n_layers * kBatch * kTokens * c.n_kv_heads * (c.head_dim + c.v_head_dim) * f32);
    EXPECT_EQ(bytes.recurrent, 0);
    EXPECT_EQ(bytes.conv, 0);
  }
  {
    std::shared_ptr<LanguageModel> model = tiny_model("gdn");
    const ModelConfig& c = model->config();
    Decoder decoder(*model, kBatch);
    decoder.feed(random_batch(c.vocab_size, 7).inputs);
    CacheBytes bytes = decoder.cache_bytes();
    EXPECT_EQ(bytes.kv, 0);
    EXPECT_EQ(bytes.recurrent, c.n_layers * kBatch * c.gdn_heads * c.gdn_head_dim * c.gdn_v_head_dim * f32);
    EXPECT_EQ(bytes.conv, c.n_layers * kBatch * (c.conv_size - 1) * (2 * c.gdn_qk_dim() + c.gdn_v_dim()) * f32);
  }
  {
    // Learned router: each cached token also keeps its score (the value scale).
    std::shared_ptr<LanguageModel> model = tiny_model("ham-learned-router");
    const ModelConfig& c = model->config();
    Decoder decoder(*model, kBatch);
    decoder.feed(random_batch(c.vocab_size, 7).inputs);
    int64_t per_token = (c.n_kv_heads * (c.head_dim + c.v_head_dim) + 1) * f32;
    for (const LayerCacheStats& s : decoder.layer_stats()) {
      EXPECT_EQ(s.kv_bytes, (s.kv_tokens[0] + s.kv_tokens[1]) * per_token);
      EXPECT_EQ(s.conv_bytes, 2 * kBatch * (c.conv_size - 1) * (2 * c.gdn_qk_dim() + c.gdn_v_dim()) * f32);
    }
  }
}

TEST(Decoding, BadInputsAreNamed) {
  std::shared_ptr<LanguageModel> transformer = tiny_model("transformer");
  std::shared_ptr<LanguageModel> ham_model = tiny_model("ham-fixed-tau");
  RoutingOverride tau;
  tau.tau = 0.5;
  testing::expect_error([&] { Decoder d(*transformer, 1, tau); }, {"Decoder", "HAM", "transformer"});
  RoutingOverride both = tau;
  both.kv_fraction = 0.5;
  testing::expect_error([&] { Decoder d(*ham_model, 1, both); }, {"Decoder", "kv_fraction", "tau"});
  RoutingOverride fraction;
  fraction.kv_fraction = 1.5;
  testing::expect_error([&] { Decoder d(*ham_model, 1, fraction); }, {"kv_fraction", "[0, 1]", "1.5"});
  RoutingOverride layer;
  layer.layer_tau[2] = 0.5;
  testing::expect_error([&] { Decoder d(*ham_model, 1, layer); }, {"layer 2", "0..1"});
  testing::expect_error([&] { Decoder d(*ham_model, 0); }, {"Decoder", "batch", "0"});

  Decoder decoder(*ham_model, 2);
  testing::expect_error([&] { decoder.feed(Tensor::zeros({1, 3}, DType::I64)); },
                        {"Decoder::feed", "[1, 3]", "B = 2"});
  testing::expect_error([&] { decoder.feed(Tensor::zeros({2, 3})); }, {"Decoder::feed", "i64", "f32"});
  testing::expect_error([&] { decoder.feed({{1, 2}, {3, 257}}); },
                        {"Decoder::feed", "token 257", "[1, 1]", "[0, 257)"});
  testing::expect_error([&] { decoder.feed({{1, 2}, {3}}); }, {"Decoder::feed", "same number"});
  EXPECT_EQ(decoder.position(), 0);  // nothing was fed
}

}  // namespace
}  // namespace ham
