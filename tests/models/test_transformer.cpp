#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "autograd/engine.h"
#include "models/accounting.h"
#include "models/transformer.h"
#include "tests/error_testing.h"
#include "tests/models/model_testing.h"

namespace ham {
namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 11;
  c.d_model = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;  // grouped-query path
  c.head_dim = 4;
  c.v_head_dim = 6;  // value heads wider than query/key heads, as HAM's KV path
  c.d_ff = 12;
  c.init_std = 0.3;  // large enough that every path carries signal in the check
  c.seed = 7;
  return c;
}

// The tiny Transformer in f64, with attention convs of width attn_conv_size (0: none).
std::unique_ptr<Transformer> tiny_f64_model(int64_t attn_conv_size) {
  ModelConfig c = tiny_config();
  c.attn_conv_size = attn_conv_size;
  auto model = std::make_unique<Transformer>(c);
  model->to(DType::F64);
  return model;
}

// Without and with attn_conv_size (a short conv + SiLU on q, k, v before RoPE): every
// parameter, the convs' included, agrees with f64 finite differences.
TEST(Transformer, WholeModelGradcheckF64) {
  for (int64_t conv : {0, 3}) {
    SCOPED_TRACE("attn_conv_size " + std::to_string(conv));
    std::unique_ptr<Transformer> owned = tiny_f64_model(conv);
    Transformer& model = *owned;
    TokenBatch batch = testing::packed_batch(2, 5, 11, /*packed=*/true);
    // eps 1e-5, not the default 1e-6: with the convs, q_proj's and k_proj's gradients are
    // about the norm floor (1e-3), where the central difference's rounding (about 4e-10 an
    // element at 1e-6, in every parameter alike) made a relative error of 0.97e-6, within 3%
    // of the tolerance: a change of rounding anywhere in the forward could cross it. At 1e-5
    // the worst is 1.3e-7.
    GradcheckOptions options;
    options.eps = 1e-5;
    GradcheckResult r = testing::model_gradcheck(model, batch, options);
    EXPECT_TRUE(r.passed) << r.summary();
    EXPECT_LT(r.worst_relative_error, 1e-6) << r.summary();
    EXPECT_EQ(r.inputs.size(), model.named_parameters().size());
  }
}

TEST(Transformer, RecomputeGivesIdenticalGradients) {
  ModelConfig c = tiny_config();
  TokenBatch batch = testing::packed_batch(2, 6, 11, false);
  Transformer plain(c);
  c.recompute = true;
  Transformer recomputed(c);
  plain.to(DType::F64);
  recomputed.to(DType::F64);
  testing::expect_same_gradients(plain, recomputed, batch);
}

TEST(Transformer, PackedDocumentsDoNotSeeEachOther) {
  // The second document's logits equal those of the same tokens run on their own: the
  // attention mask and, with attn_conv_size, the convs' taps stop at the document start.
  // Without document ids the first document leaks in (the check has teeth).
  for (int64_t conv : {0, 3}) {
    SCOPED_TRACE("attn_conv_size " + std::to_string(conv));
    std::unique_ptr<Transformer> owned = tiny_f64_model(conv);
    Transformer& model = *owned;
    TokenBatch packed = testing::packed_batch(1, 8, 11, true);
    std::vector<int64_t> ids = packed.inputs.to_vector<int64_t>();
    std::vector<int64_t> second(ids.begin() + 4, ids.end());
    TokenBatch alone{Tensor::from_vector(second, {1, 4}), Tensor::from_vector(second, {1, 4}), {}, {}};
    auto full = model.forward(packed).to_vector<double>();
    auto solo = model.forward(alone).to_vector<double>();
    for (size_t i = 0; i < solo.size(); ++i) EXPECT_NEAR(full[4 * 11 + i], solo[i], 1e-12) << i;
    TokenBatch unpacked = packed;
    unpacked.doc_ids = Tensor();
    unpacked.positions = Tensor();
    auto leaked = model.forward(unpacked).to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < solo.size(); ++i) worst = std::max(worst, std::abs(leaked[4 * 11 + i] - solo[i]));
    EXPECT_GT(worst, 1e-6);
  }
}

TEST(Transformer, ParameterCountMatchesFormula) {
  for (int64_t conv : {0, 3}) {
    ModelConfig c = tiny_config();
    c.attn_conv_size = conv;
    Transformer model(c);
    int64_t d = c.d_model, q = c.n_heads * c.head_dim, k = c.n_kv_heads * c.head_dim;
    int64_t v = c.n_kv_heads * c.v_head_dim, o = c.n_heads * c.v_head_dim;
    int64_t per_layer = 2 * d + d * q + d * k + d * v + o * d + 3 * d * c.d_ff + (q + k + v) * conv;
    EXPECT_EQ(model.num_parameters(), 2 * c.vocab_size * d + d + c.n_layers * per_layer) << conv;
    EXPECT_EQ(model.num_parameters(), formula_parameter_count(c)) << conv;
    EXPECT_NO_THROW(model.parameter("layers.1.attn.q_proj.weight"));
    EXPECT_NO_THROW(model.parameter("layers.0.mlp.down.weight"));
    if (conv) {
      EXPECT_EQ(model.parameter("layers.1.attn.k_conv.weight").shape(), (Shape{k, conv}));
    } else {
      EXPECT_THROW(model.parameter("layers.1.attn.k_conv.weight"), Error);
    }
  }
}

TEST(ModelConfig, UnknownKeyNamesSourceAndKey) {
  nlohmann::json j = {{"d_model", 16}, {"n_layer", 2}};
  try {
    ModelConfig::from_json(j, "cfg.json");
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("cfg.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("n_layer"), std::string::npos) << msg;
  }
}

TEST(ModelConfig, BadValuesAreNamed) {
  EXPECT_THROW(ModelConfig::from_json({{"n_heads", 3}, {"n_kv_heads", 2}}, "x"), Error);
  EXPECT_THROW(ModelConfig::from_json({{"d_model", "big"}}, "x"), Error);
  EXPECT_THROW(ModelConfig::from_json({{"head_dim", 5}}, "x"), Error);
  EXPECT_THROW(ModelConfig::from_json({{"family", "rwkv"}}, "x"), Error);
  try {
    ModelConfig::from_json({{"d_model", -4}}, "model.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'d_model'"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, JsonRoundTrip) {
  ModelConfig c = tiny_config();
  ModelConfig back = ModelConfig::from_json(c.to_json(), "roundtrip");
  EXPECT_EQ(back.to_json(), c.to_json());
  // attn_conv_size is written only when set, so configs from before the key stay equal.
  EXPECT_FALSE(c.to_json().contains("attn_conv_size"));
  c.attn_conv_size = 4;
  EXPECT_EQ(ModelConfig::from_json(c.to_json(), "roundtrip").attn_conv_size, 4);
}

// attn_conv_size belongs to the Transformer's and GDN-GSA's attention layers.
TEST(ModelConfig, AttentionConvSizeIsChecked) {
  testing::expect_error([] { ModelConfig::from_json({{"attn_conv_size", -1}}, "model.json"); },
                        {"model.json", "'attn_conv_size'", ">= 0"});
  testing::expect_error(
      [] { ModelConfig::from_json({{"family", "gdn"}, {"attn_conv_size", 4}}, "model.json"); },
      {"model.json", "'attn_conv_size'", "'gdn'"});
  testing::expect_error(
      [] {
        ModelConfig::from_json({{"family", "ham"}, {"attn_conv_size", 4}, {"n_heads", 2},
                                {"head_dim", 64}, {"v_head_dim", 64}, {"n_kv_heads", 2}},
                               "model.json");
      },
      {"model.json", "'attn_conv_size'", "conv_size"});
  EXPECT_EQ(ModelConfig::from_json({{"family", "gdn-gsa"}, {"attn_conv_size", 4}}, "x").attn_conv_size, 4);
}

// gdn_keep_chunk_states travels with the recurrent families' keys; a non-boolean value is
// an error naming the key.
TEST(ModelConfig, KeepChunkStatesRoundTripsAndIsChecked) {
  ModelConfig c = tiny_config();
  c.family = ModelFamily::GDN;
  c.gdn_keep_chunk_states = true;
  ModelConfig back = ModelConfig::from_json(c.to_json(), "roundtrip");
  EXPECT_TRUE(back.gdn_keep_chunk_states);
  EXPECT_FALSE(ModelConfig::from_json({{"family", "gdn"}}, "x").gdn_keep_chunk_states);
  testing::expect_error(
      [] { ModelConfig::from_json({{"gdn_keep_chunk_states", "yes"}}, "model.json"); },
      {"model.json", "gdn_keep_chunk_states"});
}

}  // namespace
}  // namespace ham
