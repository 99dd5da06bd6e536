// Model accounting against the paper's appendix: exact parameter counts of the 800M
// configs, the training-FLOPs table, the closed forms of tab:*_scaling, and the rule table
// that groups parameter names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "models/accounting.h"
#include "models/language_model.h"
#include "nn/layers.h"

namespace ham {
namespace {

// HAM_SOURCE_DIR when set, else the tree this file sits in (tests/models/...).
std::string source_dir() {
  if (const char* dir = std::getenv("HAM_SOURCE_DIR")) return dir;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}

ModelConfig paper_config(const std::string& name) {
  return ModelConfig::from_file(source_dir() + "/configs/paper/" + name + ".json");
}

const SequenceShape kPaperShape = SequenceShape::with_kv_fraction(kPaperSeqLen, 0.5);

double zflops(double flops_per_token, double tokens = kPaperTrainingTokens) {
  return training_flops(flops_per_token, tokens) / 1e21;
}

// |a - b| <= rel * |b|
void expect_relatively_near(double a, double b, double rel = 1e-12) {
  EXPECT_LE(std::abs(a - b), rel * std::abs(b)) << a << " vs " << b;
}

// ---- Parameter counts ------------------------------------------------------------------

TEST(Accounting, PaperConfigsHaveTheIssuesExactParameterCounts) {
  EXPECT_EQ(formula_parameter_count(paper_config("transformer")), 801'267'840);
  EXPECT_EQ(formula_parameter_count(paper_config("gdn")), 803'773'424);
  EXPECT_EQ(formula_parameter_count(paper_config("gdn-gsa")), 778'566'008);
  EXPECT_EQ(formula_parameter_count(paper_config("ham-fixed-tau")), 805'068'272);
}

TEST(Accounting, LayerTotalsAtThePaperDimensions) {
  // tab:params_* "Layer Total" rows, evaluated by hand at the 800M dims.
  ModelConfig tf = paper_config("transformer");
  EXPECT_EQ(mixer_parameter_count(tf, 0), 1920 * (4 * 1920 + 1));          // d(4d + 1)
  EXPECT_EQ(ffn_parameter_count(tf), 1920 + 3 * 1920 * 2560);              // d + 3 d d_int
  ModelConfig gdn = paper_config("gdn");
  // d(2 d_QK + 3 d_V + 2h + 1) + d_conv (2 d_QK + d_V) + 2h + d_V-head
  EXPECT_EQ(mixer_parameter_count(gdn, 0),
            1792 * (2 * 1280 + 3 * 1920 + 2 * 5 + 1) + 4 * (2 * 1280 + 1920) + 2 * 5 + 384);
  ModelConfig ham = paper_config("ham-fixed-tau");
  // (d + 2 d_conv + 2)(2 d_QK + d_V) + d (3 h_RNN + h_KV + 2 d_V + 1) + 2 h_RNN + 384 + 192
  EXPECT_EQ(mixer_parameter_count(ham, 0),
            (1792 + 8 + 2) * (2 * 1280 + 1920) + 1792 * (15 + 10 + 3840 + 1) + 10 + 384 + 192);
  // The Simplified rows at d = 1792: 8345/1792 d^2 + 23301/896 d + 576, 65/14 d^2 + 21 d + 394.
  EXPECT_EQ(mixer_parameter_count(ham, 0), 8345 * 1792 + 23301 * 2 + 576);
  EXPECT_EQ(mixer_parameter_count(gdn, 0), 65 * 1792 * 128 + 21 * 1792 + 394);
  // GDN-GSA: odd layers (counting from 0) are GSA = the Transformer layer at d = 1792.
  ModelConfig gsa = paper_config("gdn-gsa");
  EXPECT_EQ(layer_kind(gsa, 0), LayerKind::GDN);
  EXPECT_EQ(layer_kind(gsa, 1), LayerKind::Attention);
  EXPECT_EQ(mixer_parameter_count(gsa, 1), 1792 * (4 * 1792 + 1));
  EXPECT_EQ(mixer_parameter_count(gsa, 0), mixer_parameter_count(gdn, 0));
}

TEST(Accounting, LearnedVariantsAddTheirRows) {
  const int64_t fixed = 805'068'272, L = 24, d = 1792, h = 256;
  // tau_l: 1 per layer.
  EXPECT_EQ(formula_parameter_count(paper_config("ham-learned-tau")), fixed + L);
  // Deep router (not in the table): d h + h^2 + h per layer, as models/router.h counts it.
  int64_t router = d * h + h * h + h;
  EXPECT_EQ(formula_parameter_count(paper_config("ham-learned-router")), fixed + L + L * router);
  // EDA's gamma on every layer but the first.
  EXPECT_EQ(formula_parameter_count(paper_config("ham-learned-router-eda")),
            fixed + L + L * router + (L - 1));
  // The shallow router is the table's W_router row: d per layer.
  ModelConfig shallow = paper_config("ham-learned-router");
  shallow.router = RouterKind::InputShallow;
  EXPECT_EQ(formula_parameter_count(shallow), fixed + L + L * d);
  bool marked = false;
  for (const auto& row : mixer_parameter_rows(paper_config("ham-learned-router-eda"), 1)) {
    if (row.source.find("deep router") != std::string::npos) marked = row.extension;
  }
  EXPECT_TRUE(marked) << "rows the appendix does not have must be marked as extensions";
}

TEST(Accounting, ClosedFormParametersMatchTabParamsScaling) {
  // tab:params_scaling with L = d / rho substituted, at the paper's d.
  auto cube = [](double d, double a, double b, double c) { return a * d * d * d + b * d * d + c * d; };
  const double k = 2;
  struct Case { const char* config; double expected; };
  double d = 1792;
  for (Case c : {Case{"ham-fixed-tau", cube(d, 48075.0 / 401408, 72591.0 / 200704, 448061.0 / 7)},
                 Case{"gdn", cube(d, 375.0 / 3136, 33.0 / 112, 7168703.0 / 112)},
                 Case{"gdn-gsa", cube(d, (375 * k - 27) / (3136 * k), (33 * k - 30) / (112 * k),
                                      (7168703 * k - 591) / (112 * k))},
                 Case{"transformer", cube(1920, 23.0 / 240, 23.0 / 960, 64001)}}) {
    SCOPED_TRACE(c.config);
    ModelConfig config = paper_config(c.config);
    PaperClosedForm p = paper_closed_form(config, kPaperShape);
    ASSERT_TRUE(p.applies) << p.reason;
    expect_relatively_near(p.parameters, c.expected);
    EXPECT_EQ(std::llround(p.parameters), formula_parameter_count(config));
  }
}

// ---- FLOPs -------------------------------------------------------------------------------

TEST(Accounting, TrainingFlopsTableIsReproducedToTheDigitsShown) {
  // tab:training_flops: 3 x F(T = 16384) per rank per step x 32 ranks x 95367 steps, from
  // the paper's closed forms with T_KV = 0.5 T for HAM.
  struct Row { const char* config; double zflops; };
  for (Row row : {Row{"ham-fixed-tau", 0.3511}, Row{"gdn", 0.2467}, Row{"transformer", 0.4592},
                  Row{"gdn-gsa", 0.3429}}) {
    SCOPED_TRACE(row.config);
    PaperClosedForm p = paper_closed_form(paper_config(row.config), kPaperShape);
    ASSERT_TRUE(p.applies) << p.reason;
    EXPECT_NEAR(zflops(p.flops_per_token), row.zflops, 0.00005);
    EXPECT_NEAR(zflops(p.flops_per_token, 50e9), row.zflops, 0.00005);  // `ham info`'s default
  }
  // The "Relative" column: -29.7%, +30.8%, -2.3% against HAM.
  auto flops = [](const char* name) {
    return paper_closed_form(paper_config(name), kPaperShape).flops_per_token;
  };
  double ham = flops("ham-fixed-tau");
  EXPECT_NEAR(100 * (flops("gdn") / ham - 1), -29.7, 0.05);
  EXPECT_NEAR(100 * (flops("transformer") / ham - 1), 30.8, 0.05);
  EXPECT_NEAR(100 * (flops("gdn-gsa") / ham - 1), -2.3, 0.05);
}

TEST(Accounting, ClosedFormFlopsMatchTabFlopsScaling) {
  const double T = kPaperSeqLen, T_kv = kPaperShape.kv_len, k = 2;
  double d = 1792;
  double ham = (375.0 / 1568 * d * d * d + 99417.0 / 3136 * d * d + 28713903.0 / 224 * d) +
               T_kv * (75.0 / 3136 * d * d + 15.0 / 56 * d);
  double gdn = 12015.0 / 50176 * d * d * d + 4689327.0 / 401408 * d * d + 128004 * d;
  double gsa = (12015 * k - 879) / (50176 * k) * d * d * d +
               (10836 * T + 4689327 * k - 4572591) / (401408 * k) * d * d + 128004 * d;
  d = 1920;
  double tf = 23.0 / 120 * d * d * d + (23.0 / 90 + 989.0 / 40960 * T) * d * d + 128004 * d;
  expect_relatively_near(paper_closed_form(paper_config("ham-fixed-tau"), kPaperShape).flops_per_token, ham);
  expect_relatively_near(paper_closed_form(paper_config("gdn"), kPaperShape).flops_per_token, gdn);
  expect_relatively_near(paper_closed_form(paper_config("gdn-gsa"), kPaperShape).flops_per_token, gsa);
  expect_relatively_near(paper_closed_form(paper_config("transformer"), kPaperShape).flops_per_token, tf);
}

TEST(Accounting, TableRowsEqualTheClosedFormForHamAndTransformer) {
  // The sum of every row of tab:flops_ham / tab:flops_transformer and tab:flops_ffn equals
  // the paper's Simplified forms at the paper's dims, for any T and T_KV.
  for (double T : {2048.0, 16384.0}) {
    for (double rho : {0.1, 0.5, 1.0}) {
      SequenceShape shape = SequenceShape::with_kv_fraction(T, rho);
      for (const char* name : {"ham-fixed-tau", "transformer"}) {
        SCOPED_TRACE(std::string(name) + " T=" + std::to_string(T) + " rho=" + std::to_string(rho));
        ModelConfig c = paper_config(name);
        expect_relatively_near(forward_flops_per_token(c, shape),
                               paper_closed_form(c, shape).flops_per_token);
      }
    }
  }
  // Exact per-token values at T = 16384, T_KV = 8192.
  EXPECT_EQ(forward_flops_per_token(paper_config("ham-fixed-tau"), kPaperShape), 2'340'847'992.0);
  EXPECT_EQ(forward_flops_per_token(paper_config("transformer"), kPaperShape), 3'061'644'800.0);
  EXPECT_NEAR(zflops(forward_flops_per_token(paper_config("ham-fixed-tau"), kPaperShape)), 0.3511, 0.00005);
  EXPECT_NEAR(zflops(forward_flops_per_token(paper_config("transformer"), kPaperShape)), 0.4592, 0.00005);
}

TEST(Accounting, GdnRowsExceedThePapersPolynomial) {
  // Two slips in the paper: tab:flops_gdn's Simplified row is 9717/7 d below the sum of
  // its rows, and tab:flops_scaling's GDN polynomial is 3/56 d^2 (= 4 d per layer at
  // L = 3d/224) below its own first line. The training-FLOPs table follows the polynomial
  // (0.2467, 0.3429); the rows give 0.2557 and 0.3474.
  ModelConfig gdn = paper_config("gdn"), gsa = paper_config("gdn-gsa");
  const double d = 1792, per_layer = 9745.0 / 7 * d;  // (9717/7 + 4) d = 2,494,720
  EXPECT_EQ(per_layer, 2'494'720.0);
  for (double T : {1024.0, 16384.0}) {
    SequenceShape shape = SequenceShape::with_kv_fraction(T, 0.5);
    EXPECT_DOUBLE_EQ(forward_flops_per_token(gdn, shape) - paper_closed_form(gdn, shape).flops_per_token,
                     24 * per_layer);
    EXPECT_DOUBLE_EQ(forward_flops_per_token(gsa, shape) - paper_closed_form(gsa, shape).flops_per_token,
                     12 * per_layer);
  }
  // (1) alone: the Simplified row T d (2085/224 d + 1560037/1792) against the rows.
  double simplified_row = d * (2085.0 / 224 * d + 1560037.0 / 1792);
  EXPECT_NEAR(mixer_flops_per_token(gdn, 0, kPaperShape) - simplified_row, 9717.0 / 7 * d, 1e-6);
  // (2) alone: the first line of F_GDN against the tab:flops_scaling polynomial.
  double first_line = 24 * (simplified_row + 20.0 / 7 * d * (3 * d + 2)) + 4 * 32000 * d + 4 * d;
  EXPECT_NEAR(first_line - paper_closed_form(gdn, kPaperShape).flops_per_token, 3.0 / 56 * d * d, 1e-3);
  EXPECT_EQ(forward_flops_per_token(gdn, kPaperShape), 1'704'747'384.0);
  EXPECT_NEAR(zflops(forward_flops_per_token(gdn, kPaperShape)), 0.2557, 0.00005);
  EXPECT_NEAR(zflops(forward_flops_per_token(gsa, kPaperShape)), 0.3474, 0.00005);
  // The GDN layer's rows: Layer Total of tab:flops_gdn evaluated by hand.
  const double qk = 1280, v = 1920, h = 5, C = 64, conv = 4, vh = 384;
  double layer_total = (2 * d + 2 * conv + 7) * (2 * qk + v) + 8 * d * h +
                       h * (1 + 3.5 * C + C * C / 2) + 6 * C * qk + 4 * C * v + 6 * qk * vh +
                       12 * d + 4 * d * v + 8 * v;
  EXPECT_DOUBLE_EQ(mixer_flops_per_token(gdn, 0, kPaperShape), layer_total);
}

TEST(Accounting, HamLayerFlopsRowsSumToTheLayerTotal) {
  // tab:flops_ham's Layer Total (cosine router), by hand, for an arbitrary T_KV.
  ModelConfig c = paper_config("ham-fixed-tau");
  const double d = 1792, qk = 1280, v = 1920, hr = 5, hk = 10, C = 64, conv = 4, rvh = 384, kvh = 192;
  for (double T_kv : {0.0, 1000.0, 8192.0}) {
    double total = 4 * d * qk + 6 * d * v + 8 * conv * qk + 4 * conv * v + 6 * qk * rvh +
                   d * (16 + 2 * hk) + qk * (32 + 6 * C + T_kv) + v * (17 + 4 * C + T_kv) +
                   hr * (10 * d + 1 + 3.5 * C + C * C / 2) + 2 * T_kv * hk + 4 * rvh + 4 * kvh;
    EXPECT_DOUBLE_EQ(mixer_flops_per_token(c, 0, {16384, T_kv}), total);
  }
  // A learned router selects via the input: 2 T d instead of 12 T d.
  ModelConfig shallow = c;
  shallow.router = RouterKind::InputShallow;
  EXPECT_DOUBLE_EQ(mixer_flops_per_token(c, 0, kPaperShape) - mixer_flops_per_token(shallow, 0, kPaperShape),
                   10 * d);
}

TEST(Accounting, AttentionFlopsAreQuadraticInT) {
  // tab:flops_transformer: 8 T d (d + 2) + 129/64 T^2 d (h = d / 128) per layer.
  ModelConfig c = paper_config("transformer");
  const double d = 1920;
  for (double T : {1.0, 4096.0, 16384.0}) {
    EXPECT_DOUBLE_EQ(mixer_flops_per_token(c, 0, {T, T}), 8 * d * (d + 2) + 129.0 / 64 * T * d);
  }
  EXPECT_DOUBLE_EQ(ffn_flops_per_token(c), 2560 * (6 * d + 4));  // d_int (6d + 4)
}

// ---- Memory ------------------------------------------------------------------------------

TEST(Accounting, ForwardMemoryFollowsTheAppendix) {
  // 2P + 2 L_RNN d_QK d_RNN-V-head + 2 L_KV T_KV (d_QK + d_V), bf16 bytes.
  ModelConfig ham = paper_config("ham-fixed-tau");
  ForwardMemory m = forward_memory_bytes(ham, kPaperShape);
  EXPECT_EQ(m.weights, 2.0 * 805'068'272);
  EXPECT_EQ(m.rnn_state, 2.0 * 24 * 1280 * 384);
  EXPECT_EQ(m.kv_cache, 2.0 * 24 * 8192 * (1280 + 1920));
  EXPECT_EQ(m.total(), 2'892'020'704.0);
  EXPECT_EQ(forward_memory_bytes(paper_config("gdn"), kPaperShape).total(), 1'631'139'808.0);
  EXPECT_EQ(forward_memory_bytes(paper_config("transformer"), kPaperShape).total(), 4'496'605'440.0);
  // tab:memory_scaling, at the paper's d: equal to the rows for HAM, GDN and Transformer.
  const double T = kPaperSeqLen, T_kv = kPaperShape.kv_len, k = 2;
  double d = 1792;
  double ham_table = 48075.0 / 200704 * d * d * d + 809871.0 / 100352 * d * d +
                     75.0 / 1568 * T_kv * d * d + 896122.0 / 7 * d;
  double gdn_table = 375.0 / 1568 * d * d * d + 3111.0 / 392 * d * d + 7168703.0 / 56 * d;
  double gsa_table = (375 * k - 27) / (1568 * k) * d * d * d +
                     (12444 * k - 12360 + 75 * T) / (1568 * k) * d * d + (7168703 * k - 591) / (56 * k) * d;
  d = 1920;
  double tf_table = 23.0 / 120 * d * d * d + 23.0 / 480 * (1 + T) * d * d + 128002 * d;
  expect_relatively_near(paper_closed_form(ham, kPaperShape).memory_bytes, ham_table);
  expect_relatively_near(m.total(), ham_table);
  expect_relatively_near(paper_closed_form(paper_config("gdn"), kPaperShape).memory_bytes, gdn_table);
  expect_relatively_near(paper_closed_form(paper_config("transformer"), kPaperShape).memory_bytes, tf_table);
  // GDN-GSA: the closed form sizes the GSA KV cache at 25/14 d per token; the GSA layers
  // have d_QK + d_V = 2d, so the rows hold 2 (L/k) T (3/14 d) bytes more.
  ModelConfig gsa = paper_config("gdn-gsa");
  expect_relatively_near(paper_closed_form(gsa, kPaperShape).memory_bytes, gsa_table);
  EXPECT_EQ(forward_memory_bytes(gsa, kPaperShape).total() - paper_closed_form(gsa, kPaperShape).memory_bytes,
            2.0 * 12 * T * 384);
}

TEST(Accounting, ClosedFormsSayWhyTheyDoNotApply) {
  ModelConfig learned = paper_config("ham-learned-tau");
  PaperClosedForm p = paper_closed_form(learned, kPaperShape);
  EXPECT_FALSE(p.applies);
  EXPECT_NE(p.reason.find("fixed tau"), std::string::npos) << p.reason;
  ModelConfig tiny;  // the built-in tiny Transformer
  p = paper_closed_form(tiny, kPaperShape);
  EXPECT_FALSE(p.applies);
  EXPECT_NE(p.reason.find("head_dim must be 128"), std::string::npos) << p.reason;
  // The rows still hold for any config.
  EXPECT_GT(forward_flops_per_token(tiny, kPaperShape), 0);
  EXPECT_GT(formula_parameter_count(learned), 0);
}

// ---- Grouping parameter names -------------------------------------------------------------

TEST(Accounting, RuleTableGroupsEveryFamilysNames) {
  struct Case { const char* name; ParameterPart part; int64_t layer; };
  for (Case c : {
           Case{"embed.weight", ParameterPart::Embedding, -1},
           Case{"lm_head.weight", ParameterPart::LmHead, -1},
           Case{"final_norm.weight", ParameterPart::FinalNorm, -1},
           // Transformer and GSA layers.
           Case{"layers.0.attn_norm.weight", ParameterPart::MixerNorm, 0},
           Case{"layers.0.attn.q_proj.weight", ParameterPart::Projections, 0},
           Case{"layers.0.attn.o_proj.weight", ParameterPart::OutputProjection, 0},
           Case{"layers.0.mlp_norm.weight", ParameterPart::FfnNorm, 0},
           Case{"layers.0.mlp.gate.weight", ParameterPart::Ffn, 0},
           Case{"layers.0.mlp.down.weight", ParameterPart::Ffn, 0},
           // GDN layers.
           Case{"layers.12.mixer_norm.weight", ParameterPart::MixerNorm, 12},
           Case{"layers.12.mixer.v_proj.weight", ParameterPart::Projections, 12},
           Case{"layers.12.mixer.a_proj.weight", ParameterPart::RnnScalars, 12},
           Case{"layers.12.mixer.A_log", ParameterPart::RnnScalars, 12},
           Case{"layers.12.mixer.dt_bias", ParameterPart::RnnScalars, 12},
           Case{"layers.12.mixer.q_conv.weight", ParameterPart::Convs, 12},
           Case{"layers.12.mixer.gate_proj.weight", ParameterPart::Gates, 12},
           Case{"layers.12.mixer.o_norm.weight", ParameterPart::Norms, 12},
           // HAM layers.
           Case{"layers.3.mixer.rnn.k_conv.weight", ParameterPart::Convs, 3},
           Case{"layers.3.mixer.kv.v_norm.weight", ParameterPart::Norms, 3},
           Case{"layers.3.mixer.rnn_out_norm.weight", ParameterPart::Norms, 3},
           Case{"layers.3.mixer.rnn_gate.weight", ParameterPart::Gates, 3},
           Case{"layers.3.mixer.kv_gate.weight", ParameterPart::Gates, 3},
           Case{"layers.3.mixer.router.fc2.weight", ParameterPart::Router, 3},
           Case{"layers.3.mixer.router.proj.weight", ParameterPart::Router, 3},
           Case{"layers.3.mixer.eda.gamma_logit", ParameterPart::Eda, 3},
           Case{"layers.3.mixer.p_tau", ParameterPart::Thresholds, 3},
           // Names no rule knows land in an "other" group, never dropped.
           Case{"layers.3.mixer.mystery", ParameterPart::MixerOther, 3},
           Case{"layers.3.adapter.weight", ParameterPart::LayerOther, 3},
           Case{"pos_embed", ParameterPart::Other, -1},
       }) {
    SCOPED_TRACE(c.name);
    ParameterClass got = classify_parameter(c.name);
    EXPECT_EQ(parameter_part_name(got.part), std::string(parameter_part_name(c.part)));
    EXPECT_EQ(got.layer, c.layer);
  }
}

TEST(Accounting, BreakdownKeepsUnmatchedNamesAndCountsEverything) {
  std::vector<std::pair<std::string, Tensor>> named = {
      {"embed.weight", Tensor::zeros({10, 4})},
      {"layers.0.attn_norm.weight", Tensor::zeros({4})},
      {"layers.0.attn.q_proj.weight", Tensor::zeros({4, 4})},
      {"layers.0.attn.extra", Tensor::zeros({3})},
      {"layers.1.mlp.up.weight", Tensor::zeros({8, 4})},
      {"pos_embed", Tensor::zeros({5})},
  };
  ParameterBreakdown b = count_parameters(named);
  EXPECT_EQ(b.total, 40 + 4 + 16 + 3 + 32 + 5);
  EXPECT_EQ(b.embedding, 40);
  ASSERT_EQ(b.layers.size(), 2u);
  EXPECT_EQ(b.layers[0].mixer(), 4 + 16 + 3);
  EXPECT_EQ(b.layers[0].count(ParameterPart::MixerOther), 3);
  EXPECT_EQ(b.layers[1].ffn(), 32);
  EXPECT_EQ(b.other.count, 5);
  EXPECT_EQ(b.other.names, std::vector<std::string>{"pos_embed"});
}

// ---- Built models against the formulas -----------------------------------------------------

// Counted groups of a model built without filling its weights, against the rows. For any
// family make_model builds (use a small vocab_size: the layers are what is checked).
void expect_model_matches_formulas(const ModelConfig& c) {
  SkipInitGuard structure_only;
  auto model = make_model(c);
  ParameterBreakdown b = count_parameters(*model);
  auto model_rows = model_parameter_rows(c);
  EXPECT_EQ(b.embedding, model_rows[0].count);
  EXPECT_EQ(b.lm_head, model_rows[1].count);
  EXPECT_EQ(b.final_norm, model_rows[2].count);
  EXPECT_EQ(b.other.count, 0) << "unmatched: " << (b.other.names.empty() ? "" : b.other.names[0]);
  ASSERT_EQ(int64_t(b.layers.size()), c.n_layers);
  for (const auto& layer : b.layers) {
    SCOPED_TRACE("layer " + std::to_string(layer.layer));
    EXPECT_EQ(layer.mixer(), mixer_parameter_count(c, layer.layer));
    EXPECT_EQ(layer.ffn(), ffn_parameter_count(c));
    EXPECT_EQ(layer.count(ParameterPart::MixerOther) + layer.count(ParameterPart::LayerOther), 0);
  }
  EXPECT_EQ(b.total, formula_parameter_count(c));
  // Learned thresholds are counted by the table but are not module parameters.
  int64_t thresholds = 0;
  for (const auto& layer : b.layers) thresholds += layer.count(ParameterPart::Thresholds);
  EXPECT_EQ(thresholds, c.family == ModelFamily::HAM && c.learn_tau ? c.n_layers : 0);
  EXPECT_EQ(b.total - thresholds, model->num_parameters());
}

TEST(Accounting, TransformerModelMatchesTheTablePerLayer) {
  // The paper's layer dims (d 1920, 15 heads of 128, d_ff 2560) with 2 layers and a small
  // vocabulary, so the test allocates little.
  ModelConfig c = paper_config("transformer");
  c.n_layers = 2;
  c.vocab_size = 300;
  expect_model_matches_formulas(c);
  ModelConfig tiny;  // grouped-query heads: K and V shrink to n_kv_heads
  tiny.n_kv_heads = 2;
  expect_model_matches_formulas(tiny);
  // Its groups: pre-norm d, projections d (d_Q + d_K + d_V), output d_O d.
  SkipInitGuard structure_only;
  ParameterBreakdown b = count_parameters(*make_model(c));
  EXPECT_EQ(b.layers[0].count(ParameterPart::MixerNorm), 1920);
  EXPECT_EQ(b.layers[0].count(ParameterPart::Projections), 3 * 1920 * 1920);
  EXPECT_EQ(b.layers[0].count(ParameterPart::OutputProjection), 1920 * 1920);
}

// attn_conv_size adds W (d_Q + d_K + d_V) parameters and (d_Q + d_K + d_V)(2W + 3) FLOPs
// per token to each attention layer, grouped with the other short convs; the paper's
// closed forms then no longer apply.
TEST(Accounting, AttentionConvsAddTheirRows) {
  ModelConfig plain;  // the built-in tiny Transformer
  plain.n_kv_heads = 2;
  ModelConfig conv = plain;
  conv.attn_conv_size = 4;
  const int64_t qkv = plain.n_heads * plain.head_dim + 2 * plain.n_kv_heads * plain.head_dim;
  EXPECT_EQ(mixer_parameter_count(conv, 0) - mixer_parameter_count(plain, 0), 4 * qkv);
  EXPECT_DOUBLE_EQ(mixer_flops_per_token(conv, 0, {256, 256}) - mixer_flops_per_token(plain, 0, {256, 256}),
                   double(qkv) * (2 * 4 + 3));
  expect_model_matches_formulas(conv);
  SkipInitGuard structure_only;
  ParameterBreakdown b = count_parameters(*make_model(conv));
  EXPECT_EQ(b.layers[1].count(ParameterPart::Convs), 4 * qkv);
  for (const char* name : {"transformer", "gdn-gsa"}) {
    ModelConfig paper = paper_config(name);
    paper.attn_conv_size = 4;
    PaperClosedForm p = paper_closed_form(paper, kPaperShape);
    EXPECT_FALSE(p.applies) << name;
    EXPECT_NE(p.reason.find("attn_conv_size"), std::string::npos) << p.reason;
    expect_model_matches_formulas([&] {
      paper.n_layers = 2;
      paper.vocab_size = 300;
      return paper;
    }());
  }
}

TEST(Accounting, GdnAndGdnGsaModelsMatchTheTablePerLayer) {
  // The 800M layer dims with 4 layers (2 GDN + 2 GSA for GDN-GSA) and a small vocabulary.
  for (const char* name : {"gdn", "gdn-gsa"}) {
    SCOPED_TRACE(name);
    ModelConfig c = paper_config(name);
    c.n_layers = 4;
    c.vocab_size = 300;
    expect_model_matches_formulas(c);
  }
}

TEST(Accounting, HamModelsMatchTheTablePerLayer) {
  // Every paper HAM variant: learned tau (1 per layer, outside the module parameters),
  // the deep router and EDA's gamma (layers >= 1) included.
  for (const char* name : {"ham-fixed-tau", "ham-learned-tau", "ham-learned-router",
                           "ham-learned-router-eda"}) {
    SCOPED_TRACE(name);
    ModelConfig c = paper_config(name);
    c.n_layers = 3;
    c.vocab_size = 300;
    expect_model_matches_formulas(c);
  }
}

}  // namespace
}  // namespace ham
