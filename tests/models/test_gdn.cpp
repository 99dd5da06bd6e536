#include "models/gdn.h"

#include <cmath>
#include <filesystem>
#include <string>

#include "autograd/engine.h"
#include "tests/models/model_testing.h"

namespace ham {
namespace {

ModelConfig tiny_gdn_config(ModelFamily family, int64_t attn_conv_size = 0) {
  ModelConfig c;
  c.family = family;
  c.vocab_size = 11;
  c.d_model = 8;
  c.n_layers = 2;  // GDN-GSA with gsa_every 2: layer 0 GDN, layer 1 attention
  c.d_ff = 12;
  c.gdn_heads = 2;
  c.gdn_head_dim = 4;
  c.gdn_v_head_dim = 3;
  c.conv_size = 3;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 4;
  c.v_head_dim = 4;
  c.gsa_every = 2;
  c.attn_conv_size = attn_conv_size;
  c.init_std = 0.3;  // large enough that every path carries signal in the check
  c.seed = 7;
  return c;
}

std::shared_ptr<LanguageModel> build(const ModelConfig& c) {
  if (c.family == ModelFamily::GDNGSA) return std::make_shared<GDNGSAModel>(c);
  return std::make_shared<GDNModel>(c);
}

struct FamilyCase {
  ModelFamily family;
  int64_t attn_conv_size = 0;  // the GSA layers' q/k/v convs
};
void PrintTo(const FamilyCase& c, std::ostream* os) {
  *os << family_name(c.family) << " attn_conv_size " << c.attn_conv_size;
}

class GDNFamilies : public ::testing::TestWithParam<FamilyCase> {
 protected:
  ModelConfig config() const { return tiny_gdn_config(GetParam().family, GetParam().attn_conv_size); }
};

TEST_P(GDNFamilies, WholeModelGradcheckF64) {
  auto model = build(config());
  model->to(DType::F64);
  TokenBatch batch = testing::packed_batch(2, 6, 11, /*packed=*/true);
  GradcheckResult r = testing::model_gradcheck(*model, batch);
  EXPECT_TRUE(r.passed) << r.summary();
  EXPECT_LT(r.worst_relative_error, 1e-6) << r.summary();
  // Every parameter was checked, A_log and dt_bias included.
  EXPECT_EQ(r.inputs.size(), model->named_parameters().size());
  // Every gradient is larger than the check's denominator floor, so the errors above are
  // relative ones (A_log's and dt_bias's included).
  model->zero_grad();
  backward(model->loss(batch));
  for (const auto& [name, p] : model->named_parameters()) {
    double norm_squared = 0;
    for (double x : grad(p).to_vector<double>()) norm_squared += x * x;
    EXPECT_GT(std::sqrt(norm_squared), GradcheckOptions().norm_floor) << name;
  }
}

TEST_P(GDNFamilies, PackedDocumentsDoNotSeeEachOther) {
  // The second document's logits equal those of the same tokens run on their own: the
  // convs and the recurrent state restart at the document boundary.
  auto model = build(config());
  model->to(DType::F64);
  TokenBatch packed = testing::packed_batch(1, 10, 11, true);
  Tensor logits = model->forward(packed);
  std::vector<int64_t> ids = packed.inputs.to_vector<int64_t>();
  std::vector<int64_t> second(ids.begin() + 5, ids.end());
  TokenBatch alone{Tensor::from_vector(second, {1, 5}), Tensor::from_vector(second, {1, 5}),
                   {}, {}};
  Tensor alone_logits = model->forward(alone);
  auto full = logits.to_vector<double>(), solo = alone_logits.to_vector<double>();
  for (size_t i = 0; i < solo.size(); ++i) EXPECT_NEAR(full[5 * 11 + i], solo[i], 1e-12) << i;
  // Without document ids the first document leaks into the second (the check has teeth).
  TokenBatch unpacked = packed;
  unpacked.doc_ids = Tensor();
  unpacked.positions = Tensor();
  auto leaked = model->forward(unpacked).to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < solo.size(); ++i) {
    worst = std::max(worst, std::abs(leaked[5 * 11 + i] - solo[i]));
  }
  EXPECT_GT(worst, 1e-6);
}

TEST_P(GDNFamilies, RecomputeGivesIdenticalGradients) {
  ModelConfig c = config();
  TokenBatch batch = testing::packed_batch(2, 6, 11, true);
  auto plain = build(c);
  c.recompute = true;
  auto recomputed = build(c);
  plain->to(DType::F64);
  recomputed->to(DType::F64);
  testing::expect_same_gradients(*plain, *recomputed, batch);
}

TEST_P(GDNFamilies, SameSeedSameWeights) {
  ModelConfig c = config();
  auto a = build(c), b = build(c);
  c.seed = 8;
  auto other = build(c);
  auto pa = a->named_parameters(), pb = b->named_parameters(), po = other->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].second.to_vector<float>(), pb[i].second.to_vector<float>()) << pa[i].first;
  }
  EXPECT_NE(a->parameter("layers.0.mixer.A_log").to_vector<float>(),
            other->parameter("layers.0.mixer.A_log").to_vector<float>());
}

INSTANTIATE_TEST_SUITE_P(Families, GDNFamilies,
                         ::testing::Values(FamilyCase{ModelFamily::GDN},
                                           FamilyCase{ModelFamily::GDNGSA},
                                           FamilyCase{ModelFamily::GDNGSA, 4}),
                         [](const auto& info) {
                           if (info.param.family == ModelFamily::GDN) return std::string("GDN");
                           return std::string(info.param.attn_conv_size ? "GDNGSAWithAttentionConvs" : "GDNGSA");
                         });

TEST(GDN, DecayAndStepInitialisation) {
  // A = exp(A_log) in (0, 16]; softplus(dt_bias) = dt in [1e-3, 0.1]; conv taps within
  // +-1/sqrt(W).
  ModelConfig c = tiny_gdn_config(ModelFamily::GDN);
  c.gdn_heads = 64;
  GDNModel model(c);
  for (float a_log : model.parameter("layers.1.mixer.A_log").to_vector<float>()) {
    EXPECT_LE(std::exp(a_log), 16.0 + 1e-4);
    EXPECT_GE(std::exp(a_log), 1e-4 * (1 - 1e-6));
  }
  double smallest = 1, largest = 0;
  for (float bias : model.parameter("layers.1.mixer.dt_bias").to_vector<float>()) {
    double dt = std::log1p(std::exp(double(bias)));
    smallest = std::min(smallest, dt);
    largest = std::max(largest, dt);
  }
  EXPECT_GE(smallest, 1e-3 * (1 - 1e-4));
  EXPECT_LE(largest, 0.1 * (1 + 1e-4));
  EXPECT_LT(smallest, 3e-3);  // log-uniform: both ends of the range are reached
  EXPECT_GT(largest, 0.03);
  double bound = 1.0 / std::sqrt(double(c.conv_size));
  for (float w : model.parameter("layers.0.mixer.v_conv.weight").to_vector<float>()) {
    EXPECT_LE(std::abs(w), bound);
  }
  EXPECT_EQ(model.parameter("layers.0.mixer.o_norm.weight").shape(), (Shape{c.gdn_v_head_dim}));
}

// The appendix's per-layer counts (tab:params_gdn, tab:params_ffn, tab:params_transformer).
int64_t gdn_layer_parameters(const ModelConfig& c) {
  int64_t d = c.d_model, qk = c.gdn_qk_dim(), v = c.gdn_v_dim(), h = c.gdn_heads;
  return d * (2 * qk + 3 * v + 2 * h + 1) + c.conv_size * (2 * qk + v) + 2 * h +
         c.gdn_v_head_dim;
}
int64_t ffn_layer_parameters(const ModelConfig& c) { return c.d_model * (3 * c.d_ff + 1); }
int64_t attention_layer_parameters(const ModelConfig& c) {
  int64_t d = c.d_model, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  return d + d * q + 2 * d * kv + q * d;
}
int64_t embedding_parameters(const ModelConfig& c) { return (2 * c.vocab_size + 1) * c.d_model; }

TEST(GDN, ParameterCountMatchesAppendixFormula) {
  ModelConfig c = tiny_gdn_config(ModelFamily::GDN);
  c.n_layers = 3;
  GDNModel model(c);
  EXPECT_EQ(model.num_parameters(),
            c.n_layers * (gdn_layer_parameters(c) + ffn_layer_parameters(c)) +
                embedding_parameters(c));
  c.family = ModelFamily::GDNGSA;
  c.n_layers = 6;
  c.gsa_every = 3;  // layers 2 and 5 are attention
  GDNGSAModel hybrid(c);
  EXPECT_EQ(hybrid.num_parameters(), 4 * gdn_layer_parameters(c) +
                                         2 * attention_layer_parameters(c) +
                                         6 * ffn_layer_parameters(c) + embedding_parameters(c));
  EXPECT_NO_THROW(hybrid.parameter("layers.2.attn.q_proj.weight"));
  EXPECT_NO_THROW(hybrid.parameter("layers.3.mixer.dt_bias"));
  EXPECT_THROW(hybrid.parameter("layers.2.mixer.A_log"), Error);
}

// The source tree (the build defines HAM_SOURCE_DIR; else three levels up from here).
std::filesystem::path source_dir() {
#ifdef HAM_SOURCE_DIR
  return HAM_SOURCE_DIR;
#else
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
#endif
}

ModelConfig paper_800m(ModelFamily family) {
  ModelConfig c;
  c.family = family;
  c.vocab_size = 32000;
  c.d_model = 1792;
  c.n_layers = 24;
  c.d_ff = 2560;
  c.gdn_heads = 5;
  c.gdn_head_dim = 256;
  c.gdn_v_head_dim = 384;
  c.conv_size = 4;
  c.n_heads = 14;
  c.n_kv_heads = 14;
  c.head_dim = 128;
  c.v_head_dim = 128;
  c.gsa_every = 2;
  c.validate("paper_800m");
  return c;
}

TEST(GDN, Paper800MParameterCounts) {
  SkipInitGuard structure_only;
  EXPECT_EQ(GDNModel(paper_800m(ModelFamily::GDN)).num_parameters(), 803773424);
  EXPECT_EQ(GDNGSAModel(paper_800m(ModelFamily::GDNGSA)).num_parameters(), 778566008);
  // The same from the JSON files the CLI reads.
  std::filesystem::path paper = source_dir() / "configs" / "paper";
  EXPECT_EQ(GDNModel(ModelConfig::from_file((paper / "gdn.json").string())).num_parameters(),
            803773424);
  EXPECT_EQ(
      GDNGSAModel(ModelConfig::from_file((paper / "gdn-gsa.json").string())).num_parameters(),
      778566008);
  // The appendix's closed forms: P_GDN = L (125/14 d^2 + 22 d + 394) + 64001 d.
  int64_t d = 1792;
  EXPECT_EQ(24 * (125 * d * d / 14 + 22 * d + 394) + 64001 * d, 803773424);
}

TEST(GDN, ParameterNames) {
  // A module lists its own parameters before its children's.
  GDNModel model(tiny_gdn_config(ModelFamily::GDN));
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) {
    if (name.rfind("layers.0.", 0) == 0) names.push_back(name);
  }
  std::vector<std::string> expected = {
      "layers.0.mixer_norm.weight",      "layers.0.mixer.A_log",
      "layers.0.mixer.dt_bias",          "layers.0.mixer.q_proj.weight",
      "layers.0.mixer.k_proj.weight",    "layers.0.mixer.v_proj.weight",
      "layers.0.mixer.q_conv.weight",    "layers.0.mixer.k_conv.weight",
      "layers.0.mixer.v_conv.weight",    "layers.0.mixer.a_proj.weight",
      "layers.0.mixer.b_proj.weight",    "layers.0.mixer.gate_proj.weight",
      "layers.0.mixer.o_norm.weight",    "layers.0.mixer.o_proj.weight",
      "layers.0.mlp_norm.weight",        "layers.0.mlp.gate.weight",
      "layers.0.mlp.up.weight",          "layers.0.mlp.down.weight"};
  EXPECT_EQ(names, expected);
}

}  // namespace
}  // namespace ham
