#include "train/gradient_check.h"

#include <string>

#include <gtest/gtest.h>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "models/ham.h"
#include "models/transformer.h"
#include "nn/elementwise.h"
#include "tests/error_testing.h"

namespace ham {
namespace {

ModelConfig small_transformer() {
  ModelConfig c;
  c.vocab_size = 23;
  c.d_model = 16;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.d_ff = 24;
  c.init_std = 0.2;
  return c;
}

ModelConfig small_ham() {
  ModelConfig c;
  c.family = ModelFamily::HAM;
  c.vocab_size = 23;
  c.d_model = 8;
  c.n_layers = 2;
  c.d_ff = 12;
  c.gdn_heads = 1;
  c.gdn_head_dim = 4;
  c.gdn_v_head_dim = 6;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 2;
  c.v_head_dim = 3;
  c.conv_size = 3;
  c.init_std = 0.3;
  c.router = RouterKind::FitError;
  c.tau = 0.5;
  return c;
}

const TensorGradcheck& row(const ModelGradcheckReport& report, const std::string& name) {
  for (const TensorGradcheck& t : report.tensors) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("no row " + name);
}

TEST(GradientCheck, CorrectModelPasses) {
  Transformer model(small_transformer());
  model.to(DType::F64);
  ModelGradcheckOptions options;
  options.entries_per_tensor = 6;
  TokenBatch batch = gradcheck_batch(model.config(), 2, 8, 1);
  ModelGradcheckReport report = check_model_gradients(model, batch, options);
  EXPECT_TRUE(report.passed) << report.table();
  EXPECT_EQ(report.tensors.size(), model.named_parameters().size());
  EXPECT_EQ(report.skipped, 0);
  EXPECT_NE(report.table().find("gradcheck: PASS"), std::string::npos);
}

// A checker that cannot fail is no checker: a hook doubles one tensor's gradient.
TEST(GradientCheck, PlantedWrongGradientFailsNamingTheTensor) {
  Transformer model(small_transformer());
  model.to(DType::F64);
  register_hook(model.parameter("layers.0.mlp.up.weight"),
                [](const Tensor& g) { return scale(g, 2.0); });
  ModelGradcheckOptions options;
  TokenBatch batch = gradcheck_batch(model.config(), 2, 8, 1);
  ModelGradcheckReport report = check_model_gradients(model, batch, options);
  EXPECT_FALSE(report.passed);
  const TensorGradcheck& up = row(report, "layers.0.mlp.up.weight");
  EXPECT_FALSE(up.passed);
  EXPECT_GT(up.relative_error, 0.5);  // analytic = 2 x numeric: |2n - n| / |n| = 1
  for (const TensorGradcheck& t : report.tensors) {
    if (t.name != up.name) {
      EXPECT_TRUE(t.passed) << t.name << "\n" << report.table();
    }
  }
  EXPECT_EQ(report.worst_tensor, "layers.0.mlp.up.weight");
  EXPECT_NE(report.table().find("gradcheck: FAIL: 1 tensors over the tolerance: layers.0.mlp.up.weight"),
            std::string::npos)
      << report.table();
}

TEST(GradientCheck, DroppedGradientFails) {
  Transformer model(small_transformer());
  model.to(DType::F64);
  register_hook(model.parameter("lm_head.weight"),
                [](const Tensor& g) { return Tensor::zeros(g.shape(), g.dtype()); });
  ModelGradcheckReport report =
      check_model_gradients(model, gradcheck_batch(model.config(), 2, 8, 1), {});
  EXPECT_FALSE(report.passed);
  EXPECT_FALSE(row(report, "lm_head.weight").passed);
  EXPECT_TRUE(row(report, "embed.weight").passed);
}

// With tau placed on a token's score, probes that move that score across tau change the
// selection: they are skipped and counted, and what remains still agrees.
TEST(GradientCheck, ProbesThatFlipAHamSelectionAreSkipped) {
  HAMModel model(small_ham());
  model.to(DType::F64);
  TokenBatch batch = gradcheck_batch(model.config(), 2, 6, 3);
  {
    NoGradGuard no_grad;
    model.forward(batch);
  }
  HAMLayer& first = *model.layers[0]->mixer;
  std::vector<double> scores = first.last_trace().score.to_vector<double>();
  // A score that is not a document's first token (those are exactly 1).
  double on_a_score = -1;
  for (double e : scores) {
    if (e > 0.05 && e < 0.95) on_a_score = e;
  }
  ASSERT_GT(on_a_score, 0) << "no usable score in layer 0";
  first.threshold.set_tau(on_a_score);
  ModelGradcheckOptions options;
  options.entries_per_tensor = 6;
  ModelGradcheckReport report = check_model_gradients(model, batch, options);
  EXPECT_GT(report.skipped, 0) << report.table();
  EXPECT_GT(report.checked, 0);
  EXPECT_TRUE(report.passed) << report.table();
  EXPECT_NE(report.table().find("skipped (a +-eps probe flipped a HAM selection"),
            std::string::npos);
}

TEST(GradientCheck, F32ModelIsAnErrorNamingTheParameter) {
  Transformer model(small_transformer());
  testing::expect_error(
      [&] { check_model_gradients(model, gradcheck_batch(model.config(), 1, 4, 0), {}); },
      {"gradcheck", "embed.weight", "f32", "to(DType::F64)"});
}

TEST(GradientCheck, BatchHoldsTwoDocumentsPerRow) {
  TokenBatch batch = gradcheck_batch(small_transformer(), 2, 6, 0);
  EXPECT_EQ(batch.doc_ids.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(batch.positions.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}));
  for (int64_t id : batch.inputs.to_vector<int64_t>()) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 23);
  }
}

}  // namespace
}  // namespace ham
