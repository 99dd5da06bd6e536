// bf16 mixed precision (train option precision = "bf16"), checked on the CPU, where every
// op runs in bf16 through f32 stand-ins (core/bf16_widening.h): bf16 parameters,
// activations and gradients, f32 master weights and moments, the loss in f32.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "autograd/engine.h"
#include "models/ham.h"
#include "nn/optim.h"
#include "tests/device_training.h"
#include "tests/error_testing.h"
#include "tests/testing.h"
#include "train/checkpoint.h"

namespace ham {
namespace {

namespace fs = std::filesystem;

TrainOptions run_options(const std::string& precision, int64_t steps) {
  TrainOptions o = testing::short_run("cpu", steps);
  o.precision = precision;
  o.batch_size = 4;
  o.seq_len = 48;
  o.warmup_steps = 5;
  return o;
}

// The master of a bf16 parameter takes the f32 update, the parameter its rounding.
TEST(MixedPrecision, AdamWUpdatesAnF32MasterAndRoundsTheParameter) {
  Tensor p16 = set_requires_grad(testing::random_tensor({40}, DType::BF16, Device::cpu(), 1));
  Tensor p32 = set_requires_grad(p16.to(DType::F32));
  AdamW bf({{"all", {{"w", p16}}, 0.1, 1.0}}, {});
  AdamW f32({{"all", {{"w", p32}}, 0.1, 1.0}}, {});
  for (int step = 0; step < 3; ++step) {
    Tensor g = testing::random_tensor({40}, DType::BF16, Device::cpu(), 10 + uint64_t(step));
    set_grad(p16, g);
    set_grad(p32, g.to(DType::F32));
    bf.step(1e-3);
    f32.step(1e-3);
  }
  const Tensor master = bf.full_precision_parameters()[0].second;
  EXPECT_EQ(master.dtype(), DType::F32);
  EXPECT_EQ(master.to_vector<float>(), p32.to_vector<float>());
  EXPECT_EQ(p16.dtype(), DType::BF16);
  EXPECT_EQ(p16.to_vector<float>(), p32.to(DType::BF16).to_vector<float>());
  // Updates of 1e-3 on values near 1 are below half a bf16 ulp (2^-8): a bf16 parameter
  // updated in place would never move; the master does.
  EXPECT_NE(master.to_vector<float>(), testing::random_tensor({40}, DType::BF16, Device::cpu(), 1)
                                           .to(DType::F32)
                                           .to_vector<float>());
  bf.load_master_weights({{"w", Tensor::full({40}, 0.3, DType::F32)}});
  EXPECT_EQ(bf.full_precision_parameters()[0].second.to_vector<float>(),
            std::vector<float>(40, 0.3f));
  EXPECT_EQ(p16.to_vector<float>(), std::vector<float>(40, bf16_to_float(float_to_bf16(0.3f))));
}

// Learned routers and the decay gates' A_log and dt_bias keep f32 weights; everything else
// goes to bf16.
TEST(MixedPrecision, RoutersAndDecayGatesStayInF32) {
  ModelConfig c = ModelConfig::from_file(
      (testing::repository_dir() / "configs/tiny/ham-learned-router-eda.json").string());
  auto model = make_model(c);
  model->to(DType::BF16);
  int routers = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    const bool router = name.find(".router.") != std::string::npos ||
                        name.find(".eda.") != std::string::npos;
    const bool gate = name.ends_with("A_log") || name.ends_with("dt_bias");
    routers += router;
    EXPECT_EQ(p.dtype(), router || gate ? DType::F32 : DType::BF16) << name;
  }
  EXPECT_GT(routers, 0);
  model->to(DType::F64);  // gradchecks still move everything
  for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.dtype(), DType::F64) << name;
}

// One backward of a bf16 model against the f32 model on the same (rounded) weights: the
// loss is f32 and within 1%, every gradient within 8% relative RMS error, except the
// decay gate's (A_log, dt_bias: one number per head, and a_proj): each is a sum over every
// token of terms that mostly cancel, which magnifies the bf16 rounding of the activations,
// and in HAM a few tokens near tau route differently; they get 30% (measured: at most 26%).
TEST(MixedPrecision, Bf16GradientsTrackTheF32OnesForEveryTinyModel) {
  TokenBatch batch = testing::corpus_batch(2, 48, 3);
  for (const auto& file : testing::tiny_config_files()) {
    SCOPED_TRACE(file.filename().string());
    ModelConfig config = ModelConfig::from_file(file.string());
    auto bf = make_model(config), f32 = make_model(config);
    bf->to(DType::BF16);
    // The reference starts from the rounded weights, so only the arithmetic differs.
    std::vector<std::pair<std::string, Tensor>> rounded;
    for (const auto& [name, p] : bf->named_parameters()) rounded.emplace_back(name, p.to(DType::F32));
    f32->load_parameters(rounded);
    Tensor loss = bf->loss(batch);
    EXPECT_EQ(loss.dtype(), DType::F32);
    testing::StepResult want = testing::loss_and_gradients(*f32, batch);
    testing::StepResult got = testing::loss_and_gradients(*bf, batch);
    EXPECT_NEAR(got.loss, want.loss, 1e-2 * want.loss);
    for (size_t i = 0; i < want.gradients.size(); ++i) {
      const auto& [name, g32] = want.gradients[i];
      const Tensor& g16 = got.gradients[i].second;
      ASSERT_EQ(g16.defined(), g32.defined()) << name;
      if (!g32.defined()) continue;
      EXPECT_EQ(g16.dtype(), bf->parameter(name).dtype()) << name;
      const bool decay_gate = name.ends_with("A_log") || name.ends_with("dt_bias") ||
                              name.find("a_proj") != std::string::npos;
      EXPECT_LE(testing::relative_rms_error(g16, g32), decay_gate ? 0.3 : 0.08) << name;
    }
  }
}

// Training in bf16 follows the f32 run: every tiny model, 12 steps, losses within 2%.
TEST(MixedPrecision, EveryTinyModelTrainsInBf16AlongsideF32) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  for (const auto& file : testing::tiny_config_files()) {
    SCOPED_TRACE(file.filename().string());
    ModelConfig config = ModelConfig::from_file(file.string());
    auto bf = make_model(config), f32 = make_model(config);
    std::ostringstream log_bf, log_f32;
    TrainResult r16 = train(*bf, train_data, val_data, run_options("bf16", 12), log_bf);
    TrainResult r32 = train(*f32, train_data, val_data, run_options("f32", 12), log_f32);
    ASSERT_EQ(r16.step_losses.size(), r32.step_losses.size()) << log_bf.str();
    for (size_t s = 0; s < r32.step_losses.size(); ++s) {
      EXPECT_NEAR(r16.step_losses[s], r32.step_losses[s], 0.02 * r32.step_losses[s])
          << "step " << s + 1;
    }
    EXPECT_LT(r16.step_losses.back(), 0.9 * r16.step_losses.front()) << log_bf.str();
    // train() hands back the f32 master weights.
    for (const auto& [name, p] : bf->named_parameters()) EXPECT_EQ(p.dtype(), DType::F32) << name;
  }
}

// A bf16 checkpoint holds the f32 masters; resuming from it continues bit for bit.
TEST(MixedPrecision, ResumeIsBitIdenticalAndCheckpointsHoldF32) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  for (const char* name : {"transformer.json", "ham-learned-tau.json"}) {
    SCOPED_TRACE(name);
    ModelConfig config =
        ModelConfig::from_file((testing::repository_dir() / "configs/tiny" / name).string());
    fs::path dir = testing::fresh_temp_dir("bf16_resume");
    TrainOptions o = run_options("bf16", 8);
    o.out_dir = dir.string();
    o.checkpoint_every = 4;
    o.keep_checkpoints = 0;
    std::ostringstream log;
    auto straight = make_model(config);
    TrainResult full = train(*straight, train_data, val_data, o, log);
    CheckpointContents ck = load_checkpoint((dir / "step-00000004").string());
    for (const auto& [tensor, t] : ck.model) EXPECT_EQ(t.dtype(), DType::F32) << tensor;
    auto resumed = make_model(config);
    TrainResult rest = train(*resumed, train_data, val_data, o, log, ck);
    EXPECT_EQ(rest.step_losses, full.step_losses) << log.str();
    auto a = straight->named_parameters(), b = resumed->named_parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>()) << a[i].first;
    }
    fs::remove_all(dir);
  }
}

TEST(MixedPrecision, UnknownPrecisionIsNamed) {
  TrainOptions o;
  testing::expect_error([&] { o.update_from_json({{"precision", "fp16"}}, "run.json"); },
                        {"run.json", "precision", "fp16", "f32 or bf16"});
}

}  // namespace
}  // namespace ham
