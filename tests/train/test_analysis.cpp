#include "train/analysis.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "models/gdn.h"
#include "models/ham.h"
#include "tests/error_testing.h"
#include "train/text_data.h"

namespace ham {
namespace {

using testing::expect_error;

ModelConfig tiny_config(ModelFamily family) {
  ModelConfig c;
  c.family = family;
  c.vocab_size = 11;
  c.d_model = 8;
  c.n_layers = 2;  // GDN-GSA with gsa_every 2: layer 0 GDN, layer 1 attention
  c.d_ff = 12;
  c.gdn_heads = 2;
  c.gdn_head_dim = 4;
  c.gdn_v_head_dim = 6;
  c.conv_size = 3;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 4;    // HAM shares q/k/v: n_heads x head_dim = gdn_heads x gdn_head_dim
  c.v_head_dim = 6;  // and n_heads x v_head_dim = gdn_heads x gdn_v_head_dim
  c.gsa_every = 2;
  c.router = RouterKind::FitError;
  c.tau = 0.5;
  c.init_std = 0.3;
  c.seed = 7;
  return c;
}

std::vector<int64_t> pattern_tokens(int64_t T, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < T; ++t) ids.push_back((5 * t + 1 + t * t) % vocab);
  return ids;
}

// ---- Building blocks -----------------------------------------------------------------------

TEST(Analysis, KvCacheGrowthIsCumulativeSelection) {
  EXPECT_EQ(kv_cache_growth({1, 0, 1, 1, 0, 0, 1}), (std::vector<int64_t>{1, 1, 2, 3, 3, 3, 4}));
  EXPECT_EQ(kv_cache_growth({0, 0}), (std::vector<int64_t>{0, 0}));
  EXPECT_TRUE(kv_cache_growth({}).empty());
}

TEST(Analysis, ResetsAreWhereAlphaIsBelowTheThreshold) {
  std::vector<double> alpha = {0.9, 0.04, 0.05, 0.01, 0.5, 0.049};
  EXPECT_EQ(reset_positions(alpha), (std::vector<int64_t>{1, 3, 5}));  // 0.05 is not < 0.05
  EXPECT_EQ(reset_positions(alpha, 0.6), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  std::vector<double> gate = gate_from_log_decay({0.0, std::log(0.01), -1.0});
  EXPECT_DOUBLE_EQ(gate[0], 1.0);
  EXPECT_NEAR(gate[1], 0.01, 1e-15);
  EXPECT_DOUBLE_EQ(gate[2], std::exp(-1.0));
}

// A [2, 4] trace with 2 heads; row 1 is read.
struct ConstructedTrace {
  Tensor score = Tensor::from_vector(std::vector<double>{9, 9, 9, 9, 0.1, 0.7, 0.3, 0.9}, {2, 4});
  Tensor select = Tensor::from_vector(std::vector<uint8_t>{1, 1, 1, 1, 0, 1, 0, 1}, {2, 4});
  // [B, T, h]: row 1 head 0 = 0.2 0.4 0.6 0.8, head 1 = 0.5 0.1 0.9 0.3
  Tensor fit_error = Tensor::from_vector(
      std::vector<double>{0, 0, 0, 0, 0, 0, 0, 0, 0.2, 0.5, 0.4, 0.1, 0.6, 0.9, 0.8, 0.3}, {2, 4, 2});
  // row 1 gates: head 0 = 0.9 0.01 0.9 0.9 (one reset at t = 1), head 1 = 0.04 0.03 0.9 0.5
  Tensor log_decay = Tensor::from_vector(
      std::vector<double>{0, 0, 0, 0, 0, 0, 0, 0, std::log(0.9), std::log(0.04), std::log(0.01),
                          std::log(0.03), std::log(0.9), std::log(0.9), std::log(0.9), std::log(0.5)},
      {2, 4, 2});
};

TEST(Analysis, LayerTraceOfAConstructedHamRow) {
  ConstructedTrace c;
  LayerSequenceTrace a = layer_sequence_trace(3, AnalyzedLayerKind::HAM, 0.5, c.score, c.select,
                                              c.fit_error, c.log_decay, 1);
  EXPECT_EQ(a.layer, 3);
  EXPECT_EQ(a.heads(), 2);
  EXPECT_DOUBLE_EQ(a.tau, 0.5);
  EXPECT_EQ(a.score, (std::vector<double>{0.1, 0.7, 0.3, 0.9}));
  EXPECT_EQ(a.selected, (std::vector<uint8_t>{0, 1, 0, 1}));
  EXPECT_EQ(a.kv_size, (std::vector<int64_t>{0, 1, 1, 2}));
  EXPECT_EQ(a.fit_error[0], (std::vector<double>{0.2, 0.4, 0.6, 0.8}));
  EXPECT_EQ(a.fit_error[1], (std::vector<double>{0.5, 0.1, 0.9, 0.3}));
  EXPECT_NEAR(a.alpha[0][1], 0.01, 1e-12);
  EXPECT_NEAR(a.alpha[1][3], 0.5, 1e-12);
  EXPECT_EQ(a.resets[0], (std::vector<int64_t>{1}));
  EXPECT_EQ(a.resets[1], (std::vector<int64_t>{0, 1}));
  // A stricter threshold counts fewer resets.
  LayerSequenceTrace strict = layer_sequence_trace(3, AnalyzedLayerKind::HAM, 0.5, c.score, c.select,
                                                   c.fit_error, c.log_decay, 1, 0.02);
  EXPECT_EQ(strict.resets[0], (std::vector<int64_t>{1}));
  EXPECT_TRUE(strict.resets[1].empty());
}

TEST(Analysis, GdnLayerScoreIsTheLowestHeadFitError) {
  ConstructedTrace c;
  LayerSequenceTrace a = layer_sequence_trace(0, AnalyzedLayerKind::GDN, 0.5, Tensor(), Tensor(),
                                              c.fit_error, c.log_decay, 1);
  EXPECT_EQ(a.score, (std::vector<double>{0.2, 0.1, 0.6, 0.3}));
  EXPECT_TRUE(a.selected.empty());
  EXPECT_TRUE(a.kv_size.empty());
  EXPECT_TRUE(std::isnan(a.tau));
}

TEST(Analysis, BadTraceTensorsAreNamed) {
  ConstructedTrace c;
  expect_error([&] {
    layer_sequence_trace(2, AnalyzedLayerKind::HAM, 0.5, c.score, c.select,
                         c.fit_error.reshape({2, 8}), c.log_decay, 0);
  }, {"layer 2 trace", "fit_error", "[B, T, heads]", "[2, 8]"});
  expect_error([&] {
    layer_sequence_trace(2, AnalyzedLayerKind::HAM, 0.5, c.score, c.select, c.fit_error,
                         c.log_decay.reshape({2, 2, 4}), 0);
  }, {"layer 2 trace", "log_decay", "[2, 4, 2]", "[2, 2, 4]"});
  expect_error([&] {
    layer_sequence_trace(2, AnalyzedLayerKind::HAM, 0.5, c.score, c.select, c.fit_error,
                         c.log_decay, 2);
  }, {"layer 2 trace", "row 2", "batch of 2"});
  expect_error([&] {
    layer_sequence_trace(2, AnalyzedLayerKind::HAM, 0.5, Tensor(), c.select, c.fit_error,
                         c.log_decay, 0);
  }, {"layer 2 trace", "score must be [2, 4]", "nothing"});
}

TEST(Analysis, ScoreContrastOfNeedleAndHaystack) {
  std::vector<double> score = {5, 1, 1, 4, 4, 1, 3, 7};
  // Needle [3, 5), haystack [1, 7) without the needle: 1 1 1 3.
  ScoreContrast c = score_contrast(score, {{3, 5}}, {{1, 7}});
  EXPECT_EQ(c.needle_tokens, 2);
  EXPECT_EQ(c.haystack_tokens, 4);
  EXPECT_DOUBLE_EQ(c.needle_mean(), 4.0);
  EXPECT_DOUBLE_EQ(c.haystack_mean(), 1.5);
  EXPECT_DOUBLE_EQ(c.ratio(), 4.0 / 1.5);
  // No haystack spans: every token outside the needle.
  ScoreContrast everything = score_contrast(score, {{3, 5}}, {});
  EXPECT_EQ(everything.haystack_tokens, 6);
  EXPECT_DOUBLE_EQ(everything.haystack_mean(), 18.0 / 6.0);
  // No needle: NaN.
  EXPECT_TRUE(std::isnan(score_contrast(score, {}, {}).ratio()));
  expect_error([&] { score_contrast(score, {{6, 9}}, {}); },
               {"score_contrast", "needle span [6, 9)", "8 scores"});
}

// Two hand-made sequences of 4 and 2 tokens, one layer with one head.
std::vector<SequenceAnalysis> hand_made_sequences() {
  LayerSequenceTrace a;
  a.layer = 1;
  a.tau = 0.5;
  a.score = {0.2, 0.9, 0.8, 0.1};
  a.selected = {0, 1, 1, 0};
  a.kv_size = kv_cache_growth(a.selected);
  a.fit_error = {{0.2, 0.9, 0.8, 0.1}};
  a.alpha = {{0.9, 0.01, 0.5, 0.5}};
  a.resets = {reset_positions(a.alpha[0])};
  LayerSequenceTrace b = a;
  b.score = {0.4, 0.7};
  b.selected = {0, 1};
  b.kv_size = kv_cache_growth(b.selected);
  b.fit_error = {{0.4, 0.7}};
  b.alpha = {{0.02, 0.03}};
  b.resets = {reset_positions(b.alpha[0])};
  SequenceAnalysis first{{{1, 2, 3, 4}, {{1, 3}}, {}, {}}, {a}};
  SequenceAnalysis second{{{5, 6}, {}, {}, {}}, {b}};
  return {first, second};
}

TEST(Analysis, SummaryAveragesOverSequences) {
  std::vector<LayerSummary> summaries = summarize_layers(hand_made_sequences(), {1, 3});
  ASSERT_EQ(summaries.size(), 1u);
  const LayerSummary& s = summaries[0];
  EXPECT_EQ(s.layer, 1);
  EXPECT_EQ(s.sequences, 2);
  EXPECT_EQ(s.tokens, 6);
  EXPECT_DOUBLE_EQ(s.kv_fraction, 3.0 / 6.0);
  EXPECT_NEAR(s.mean_score, (0.2 + 0.9 + 0.8 + 0.1 + 0.4 + 0.7) / 6.0, 1e-15);
  EXPECT_EQ(s.resets, (std::vector<int64_t>{3}));
  EXPECT_DOUBLE_EQ(s.reset_rate[0], 0.5);
  EXPECT_EQ(s.sequences_at, (std::vector<int64_t>{2, 2, 1, 1}));
  EXPECT_NEAR(s.mean_score_at[0], 0.3, 1e-15);
  EXPECT_NEAR(s.std_score_at[0], 0.1, 1e-12);
  EXPECT_NEAR(s.mean_score_at[2], 0.8, 1e-15);
  EXPECT_DOUBLE_EQ(s.std_score_at[2], 0.0);
  EXPECT_EQ(s.mean_kv_at, (std::vector<double>{0, 1, 2, 2}));
  EXPECT_NEAR(s.mean_alpha_at[0][1], 0.02, 1e-15);
  // Only the first sequence has a needle: [1, 3) against 0.2 and 0.1.
  EXPECT_EQ(s.needle.needle_tokens, 2);
  EXPECT_EQ(s.needle.haystack_tokens, 2);
  EXPECT_NEAR(s.needle.ratio(), 0.85 / 0.15, 1e-12);
  // Both needle tokens are selected, neither haystack token.
  EXPECT_DOUBLE_EQ(s.needle_selection.needle_mean(), 1.0);
  EXPECT_DOUBLE_EQ(s.needle_selection.haystack_mean(), 0.0);
  // Offsets -1 .. 2 from the needle's first token (t = 1): scores 0.2 0.9 0.8 0.1.
  EXPECT_EQ(s.needle_aligned_count, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(s.needle_aligned_score, (std::vector<double>{0.2, 0.9, 0.8, 0.1}));
}

TEST(Analysis, SummaryRejectsSequencesOfDifferentModels) {
  std::vector<SequenceAnalysis> sequences = hand_made_sequences();
  sequences[1].layers[0].layer = 0;
  expect_error([&] { summarize_layers(sequences); },
               {"summarize_layers", "sequence 1", "not the same model"});
  expect_error([&] { summarize_layers({}); }, {"summarize_layers", "no sequences"});
}

// ---- Models ---------------------------------------------------------------------------------

TEST(Analysis, HamTraceMatchesTheLayersOwnTrace) {
  HAMModel model(tiny_config(ModelFamily::HAM));
  const int64_t T = 24;
  std::vector<SequenceAnalysis> result = analyze_sequences(model, {{pattern_tokens(T, 11), {}, {}, {}}});
  ASSERT_EQ(result.size(), 1u);
  ASSERT_EQ(result[0].layers.size(), 2u);
  std::vector<LayerRouting> routing = model.routing();
  int64_t selected_somewhere = 0;
  for (size_t l = 0; l < 2; ++l) {
    const LayerSequenceTrace& a = result[0].layers[l];
    const HAMLayerTrace& trace = model.layers[l]->mixer->last_trace();
    EXPECT_EQ(a.kind, AnalyzedLayerKind::HAM);
    EXPECT_EQ(a.heads(), 2);
    EXPECT_EQ(a.score, trace.score.to_vector<double>());
    // T_KV(t) is the running count of the layer's own selection.
    std::vector<uint8_t> select = trace.select.to_vector<uint8_t>();
    int64_t running = 0;
    for (int64_t t = 0; t < T; ++t) {
      running += select[size_t(t)];
      EXPECT_EQ(a.kv_size[size_t(t)], running) << "layer " << l << " t " << t;
      EXPECT_EQ(a.selected[size_t(t)], select[size_t(t)]);
      EXPECT_EQ(a.selected[size_t(t)], a.score[size_t(t)] >= a.tau ? 1 : 0);
    }
    selected_somewhere += running;
    EXPECT_DOUBLE_EQ(double(a.kv_size.back()) / double(T), routing[l].kv_fraction);
    std::vector<double> log_decay = trace.log_decay.to_vector<double>();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < 2; ++h) {
        EXPECT_DOUBLE_EQ(a.alpha[size_t(h)][size_t(t)], std::exp(log_decay[size_t(t * 2 + h)]));
      }
    }
  }
  EXPECT_GT(selected_somewhere, 0);
}

TEST(Analysis, GdnAndHybridModelsGiveGateTraces) {
  GDNModel gdn(tiny_config(ModelFamily::GDN));
  std::vector<SequenceAnalysis> result = analyze_sequences(gdn, {{pattern_tokens(16, 11), {}, {}, {}}});
  ASSERT_EQ(result[0].layers.size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    const LayerSequenceTrace& a = result[0].layers[l];
    EXPECT_EQ(a.kind, AnalyzedLayerKind::GDN);
    EXPECT_EQ(a.layer, int64_t(l));
    std::vector<double> log_decay = gdn.layers[l]->mixer->last_trace().log_decay.to_vector<double>();
    for (int64_t t = 0; t < 16; ++t) {
      EXPECT_DOUBLE_EQ(a.alpha[1][size_t(t)], std::exp(log_decay[size_t(t * 2 + 1)]));
      EXPECT_GT(a.alpha[1][size_t(t)], 0.0);
      EXPECT_LE(a.alpha[1][size_t(t)], 1.0);
    }
  }
  // GDN-GSA: only the GDN layer (0) is analyzed; layer 1 is attention.
  GDNGSAModel hybrid(tiny_config(ModelFamily::GDNGSA));
  result = analyze_sequences(hybrid, {{pattern_tokens(16, 11), {}, {}, {}}});
  ASSERT_EQ(result[0].layers.size(), 1u);
  EXPECT_EQ(result[0].layers[0].layer, 0);
}

// A GDN layer computes its fit error only while trace_fit_error is on, which the analysis
// turns on for its forwards and back off after: the traced fit error is the delta rule's
// (in [0, 2], not constant), and a forward outside the analysis traces none, which
// last_forward_traces names.
TEST(Analysis, GdnLayersTraceTheirFitErrorOnlyForTheAnalysis) {
  GDNModel gdn(tiny_config(ModelFamily::GDN));
  const GatedDeltaNet& mixer = *gdn.layers[0]->mixer;
  EXPECT_FALSE(mixer.traces_fit_error());
  std::vector<SequenceAnalysis> result =
      analyze_sequences(gdn, {{pattern_tokens(16, 11), {}, {}, {}}});
  EXPECT_FALSE(mixer.traces_fit_error());
  const std::vector<double>& fit = result[0].layers[0].fit_error[0];
  EXPECT_NE(*std::min_element(fit.begin(), fit.end()), *std::max_element(fit.begin(), fit.end()));
  for (double e : fit) {
    EXPECT_GE(e, 0.0);
    EXPECT_LE(e, 2.0);
  }
  NoGradGuard no_grad;
  gdn.forward(TokenBatch{Tensor::from_vector(pattern_tokens(16, 11), {1, 16}), Tensor(), Tensor(),
                         Tensor()});
  EXPECT_FALSE(mixer.last_trace().fit_error.defined());
  expect_error([&] { last_forward_traces(gdn, 0); },
               {"analyze", "GDN layer 0", "did not trace its fit error"});
  for (const auto& layer : gdn.layers) layer->mixer->trace_fit_error(true);
  gdn.forward(TokenBatch{Tensor::from_vector(pattern_tokens(16, 11), {1, 16}), Tensor(), Tensor(),
                         Tensor()});
  ASSERT_TRUE(mixer.last_trace().fit_error.defined());
  EXPECT_EQ(last_forward_traces(gdn, 0)[0].fit_error, result[0].layers[0].fit_error);
}

TEST(Analysis, BadInputsAreNamed) {
  HAMModel model(tiny_config(ModelFamily::HAM));
  expect_error([&] { analyze_sequences(model, {}); }, {"analyze", "no sequences"});
  expect_error([&] { analyze_sequences(model, {{pattern_tokens(8, 11), {}, {}, {}}, {{}, {}, {}, {}}}); },
               {"analyze", "input 1", "no tokens"});
  expect_error([&] { analyze_sequences(model, {{{1, 2, 11}, {}, {}, {}}}); },
               {"analyze", "input 0", "token 2 is 11", "vocabulary [0, 11)"});
  expect_error([&] { analyze_sequences(model, {{pattern_tokens(8, 11), {{6, 9}}, {}, {}}}); },
               {"analyze", "input 0", "needle span 0 [6, 9)", "8 tokens"});
  expect_error([&] { analyze_sequences(model, {{pattern_tokens(8, 11), {}, {}, {{-1, 2}}}}); },
               {"analyze", "input 0", "query span 0"});
  ModelConfig transformer_config = tiny_config(ModelFamily::Transformer);
  auto transformer = make_model(transformer_config);
  expect_error([&] { analyze_sequences(*transformer, {{pattern_tokens(8, 11), {}, {}, {}}}); },
               {"analyze", "transformer model has no HAM or GDN layers"});
}

// ---- NIAH spans --------------------------------------------------------------------------------

TEST(Analysis, NiahTokenSpansCoverThePromptParts) {
  ByteTokenizer bytes;
  TextEncoder encode = [&bytes](std::string_view text) { return bytes.encode(text); };
  NiahConfig config = NiahConfig::preset(NiahKind::MultiKey1, 1500, 3);  // 4 needles
  NiahExample ex = make_niah_example(config);
  NiahTokenSpans spans = niah_token_spans(ex, encode);
  std::vector<int64_t> ids = encode(ex.prompt);
  auto text_of = [&](TokenSpan s) {
    return bytes.decode(std::vector<int64_t>(ids.begin() + s.begin, ids.begin() + s.end));
  };
  ASSERT_EQ(spans.needles.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(text_of(spans.needles[i]), ex.needles[i]);
    EXPECT_GE(spans.needles[i].begin, spans.context.begin);
    EXPECT_LE(spans.needles[i].end, spans.context.end);
  }
  EXPECT_EQ(text_of(spans.context), ex.context);
  EXPECT_EQ(text_of(spans.question), ex.question);
  EXPECT_EQ(spans.instructions.begin, 0);
  EXPECT_EQ(spans.instructions.end + 1, spans.context.begin);  // the "\n" between them
  EXPECT_EQ(spans.question.end, int64_t(ids.size()));

  // With a coarser tokenizer (two bytes per token) the spans follow the prefix lengths.
  TextEncoder pairs = [](std::string_view text) {
    return std::vector<int64_t>((text.size() + 1) / 2, 0);
  };
  NiahTokenSpans coarse = niah_token_spans(ex, pairs);
  size_t offset = ex.needle_offsets[0];
  EXPECT_EQ(coarse.needles[0].begin, int64_t((offset + 1) / 2));
  EXPECT_EQ(coarse.needles[0].end, int64_t((offset + ex.needles[0].size() + 1) / 2));

  NiahExample broken = ex;
  broken.question = "not the question";
  expect_error([&] { niah_token_spans(broken, encode); },
               {"niah_token_spans", "does not end with its question"});
}

}  // namespace
}  // namespace ham
