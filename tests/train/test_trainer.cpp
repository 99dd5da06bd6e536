#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "autograd/node.h"
#include "core/profiler.h"
#include "models/transformer.h"
#include "tests/error_testing.h"
#include "tests/testing.h"

namespace ham {
namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.d_model = 32;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.d_ff = 64;
  return c;
}

TEST(Trainer, LossFallsOnTheEmbeddedCorpus) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  Transformer model(small_config());
  TrainOptions opt;
  opt.steps = 60;
  opt.batch_size = 4;
  opt.seq_len = 32;
  opt.log_every = 20;
  opt.eval_every = 60;
  opt.eval_batches = 2;
  std::ostringstream log;
  TrainResult r = train(model, train_data, val_data, opt, log);
  EXPECT_NEAR(r.first_loss, std::log(257.0), 0.3) << log.str();
  EXPECT_LT(r.final_loss, 0.8 * r.first_loss) << log.str();
  EXPECT_LT(r.final_val_loss, r.initial_val_loss) << log.str();
  EXPECT_NE(log.str().find("tok/s"), std::string::npos);
  // Parameters, gradients and AdamW's two moments are held at once: four f32 copies at least.
  EXPECT_GE(r.peak_memory_bytes, 4 * 4 * model.num_parameters());
  EXPECT_LT(r.peak_memory_bytes, 64 * 4 * model.num_parameters());
  EXPECT_NE(log.str().find(" MiB | eta"), std::string::npos) << log.str();
}

TEST(Trainer, NonFiniteGradientStopsAndNamesTheParameter) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  Transformer model(small_config());
  Tensor w = model.parameter("layers.0.mlp.up.weight");
  register_hook(w, [](const Tensor& g) { return Tensor::full(g.shape(), NAN, g.dtype()); });
  Tensor before = w.clone();
  TrainOptions opt;
  opt.steps = 3;
  opt.batch_size = 2;
  opt.seq_len = 16;
  std::ostringstream log;
  try {
    train(model, train_data, val_data, opt, log);
    FAIL() << "expected the NaN gradient to stop training";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("layers.0.mlp.up.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step 1"), std::string::npos) << msg;
  }
  // The poisoned step changed nothing.
  EXPECT_EQ(w.to_vector<float>(), before.to_vector<float>());
}

TEST(Trainer, SkipNonFiniteKeepsGoing) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  Transformer model(small_config());
  Tensor w = model.parameter("lm_head.weight");
  int calls = 0;
  register_hook(w, [&calls](const Tensor& g) {
    return ++calls == 2 ? Tensor::full(g.shape(), INFINITY, g.dtype()) : Tensor();
  });
  TrainOptions opt;
  opt.steps = 4;
  opt.batch_size = 2;
  opt.seq_len = 16;
  opt.skip_nonfinite = true;
  std::ostringstream log;
  TrainResult r = train(model, train_data, val_data, opt, log);
  EXPECT_EQ(r.skipped_steps, 1);
  EXPECT_EQ(r.steps, 4);
  EXPECT_NE(log.str().find("skipped"), std::string::npos);
}

TEST(TrainOptions, ValuesOutOfRangeAreOneLineErrorsNamingTheKeyAndFlag) {
  struct Case {
    nlohmann::json value;
    std::vector<std::string> named;
  };
  const std::vector<Case> cases = {
      {{{"lr", -1}}, {"run.json", "'lr' (--lr)", "finite and > 0", "got -1"}},
      {{{"lr", 0}}, {"'lr' (--lr)"}},
      {{{"min_lr_ratio", 2}}, {"'min_lr_ratio'", "in [0, 1]", "got 2"}},
      {{{"warmup_steps", -5}}, {"'warmup_steps' (--warmup)", ">= 0"}},
      {{{"weight_decay", -0.1}}, {"'weight_decay' (--weight-decay)"}},
      {{{"beta1", 1.5}}, {"'beta1'", "in [0, 1)", "got 1.5"}},
      {{{"beta2", 1}}, {"'beta2'", "in [0, 1)"}},
      {{{"eps", 0}}, {"'eps'", "finite and > 0"}},
      {{{"clip", -1}}, {"'clip' (--clip)", "0: no clipping"}},
      {{{"log_every", 0}}, {"'log_every' (--log-every)", "> 0", "got 0"}},
      {{{"eval_every", -1}}, {"'eval_every' (--eval-every)", "0: only at the end"}},
      {{{"eval_batches", 0}}, {"'eval_batches'"}},
      {{{"checkpoint_every", -2}}, {"'checkpoint_every' (--checkpoint-every)"}},
      {{{"keep_checkpoints", -1}}, {"'keep_checkpoints' (--keep)"}},
      {{{"mix_mqar", 0.7}, {"mix_niah", 0.5}}, {"'mix_mqar' + 'mix_niah'", "<= 1", "got 1.2"}},
      {{{"mqar_pairs", 0}}, {"'mqar_pairs' (--mqar-pairs)"}},
      {{{"peak_gflops", -5}}, {"'peak_gflops' (--peak-gflops)"}},
      {{{"grad_norms_every", -1}}, {"'grad_norms_every' (--grad-norms-every)"}},
      {{{"shard_group_size", -1}}, {"'shard_group_size' (--shard-group-size)"}},
      {{{"steps", 0}}, {"'steps' (--steps)", "> 0"}},
      {{{"grad_accum", -1}}, {"'grad_accum' (--grad-accum)"}},
      {{{"profile_steps", -1}}, {"'profile_steps' (--profile)", ">= 0"}},
      {{{"profile_trace", "p.json"}}, {"'profile_trace' (--profile-trace)", "(--profile) > 0"}},
  };
  for (const Case& c : cases) {
    TrainOptions o;
    const TrainOptions before = o;
    testing::expect_error([&] { o.update_from_json(c.value, "run.json"); }, c.named);
    EXPECT_EQ(o.to_json(), before.to_json()) << "a rejected file changed the options";
  }
  // Values no JSON file can hold, set by a program or a flag, fail where training starts.
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  Transformer model(small_config());
  for (double bad : {double(NAN), double(INFINITY)}) {
    TrainOptions o;
    o.lr = bad;
    std::ostringstream log;
    testing::expect_error([&] { train(model, train_data, val_data, o, log); },
                          {"train option 'lr' (--lr)", "finite and > 0"});
    EXPECT_EQ(log.str(), "") << "no work before the check";
  }
}

// --profile 2 of 4 steps: steps 2 and 3 timed op by op, by phase, as a table in the log
// and a Chrome trace in the output directory; the losses are those of a run without it.
TEST(Trainer, ProfileTimesEveryOpOfItsStepsByPhase) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  const std::filesystem::path out = testing::fresh_temp_dir("profiled_run");
  auto run = [&](int64_t profile_steps, std::string* log_text) {
    Transformer model(small_config());
    TrainOptions opt;
    opt.update_from_json({{"steps", 4}, {"batch_size", 2}, {"seq_len", 16}, {"log_every", 1},
                          {"eval_every", 0}, {"eval_batches", 1}, {"clip", 1e-3},
                          {"profile_steps", profile_steps}},
                         "run.json");
    if (profile_steps > 0) opt.out_dir = out.string();
    std::ostringstream log;
    TrainResult r = train(model, train_data, val_data, opt, log);
    if (log_text) *log_text = log.str();
    return r.step_losses;
  };
  std::string log;
  const std::vector<double> profiled = run(2, &log);
  EXPECT_EQ(profiled, run(0, nullptr));
  EXPECT_FALSE(profiler::active());
  const size_t table = log.find("profile: 2 steps");
  ASSERT_NE(table, std::string::npos) << log;
  // Right after step 3's optimizer step (the window is steps 2 and 3), before its line.
  EXPECT_GT(table, log.find("step     2/4 | loss")) << log;
  EXPECT_LT(table, log.find("step     3/4 | loss")) << log;
  // A row of the table: its phase and op, then the device and the calls a step ("" where
  // there is no such row).
  auto calls_in_row = [&](const std::string& phase, const std::string& op) {
    std::istringstream lines(log.substr(table));
    for (std::string line; std::getline(lines, line);) {
      std::istringstream words(line);
      std::string first, second, third, calls;
      words >> first >> second >> third >> calls;
      if (first == phase && second == op && third == "cpu") return calls;
    }
    return std::string();
  };
  for (auto [phase, op] : {std::pair{"forward", "gemm"}, {"backward", "gemm"},
                           {"optimizer", "adamw_step_multi"},
                           {"forward", "cross_entropy_with_grad"}}) {
    EXPECT_NE(calls_in_row(phase, op), "") << phase << " " << op << " in:\n" << log;
  }
  // Every gradient's squared norm in one call a step, for the check and the clipping both.
  // The clipping (biting at clip 1e-3) scales the gradients inside the AdamW update: no
  // norms of its own and no scale a tensor.
  EXPECT_EQ(calls_in_row("nonfinite_check", "squared_norms"), "1.0") << log;
  EXPECT_EQ(calls_in_row("optimizer", "squared_norms"), "") << log;
  EXPECT_EQ(calls_in_row("optimizer", "scale"), "") << log;
  EXPECT_EQ(calls_in_row("nonfinite_check", "squared_norm"), "") << log;
  // The slowest calls follow the table, with their tensors.
  EXPECT_GT(log.find("the 10 slowest calls:"), table) << log;
  EXPECT_NE(log.find(" f32["), std::string::npos) << log;
  EXPECT_NE(log.find("profile trace: " + (out / "profile.json").string()), std::string::npos);
  std::ifstream in(out / "profile.json");
  const nlohmann::json trace = nlohmann::json::parse(in);
  size_t gemm_events = 0;
  for (const auto& e : trace.at("traceEvents")) gemm_events += e.at("name") == "gemm";
  EXPECT_GT(gemm_events, 0u);
  std::filesystem::remove_all(out);
}

// clip 0 trains without a bound, as an unreachable bound does; eval_every 0 evaluates after
// the last step only (and, as always, before the first).
TEST(Trainer, ClipZeroMeansNoClippingAndEvalEveryZeroOnlyTheLastStep) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  auto run = [&](double clip, int64_t eval_every, std::string* log_text) {
    Transformer model(small_config());
    TrainOptions opt;
    opt.update_from_json({{"steps", 3}, {"batch_size", 2}, {"seq_len", 16}, {"clip", clip},
                          {"log_every", 1}, {"eval_every", eval_every}, {"eval_batches", 1}},
                         "run.json");
    std::ostringstream log;
    train(model, train_data, val_data, opt, log);
    if (log_text) *log_text = log.str();
    return model.parameter("layers.0.mlp.up.weight").to_vector<float>();
  };
  std::string log;
  const std::vector<float> unclipped = run(0, 0, &log);
  EXPECT_EQ(unclipped, run(1e30, 1, nullptr));
  EXPECT_NE(unclipped, run(1e-3, 1, nullptr)) << "the bound must bite at 1e-3";
  size_t evaluations = 0;
  for (size_t at = log.find("val loss"); at != std::string::npos;
       at = log.find("val loss", at + 1)) {
    ++evaluations;
  }
  EXPECT_EQ(evaluations, 2u) << log;  // before the first step and after the last
  EXPECT_NE(log.find("step     0/3 | val loss"), std::string::npos) << log;
  EXPECT_NE(log.find("step     3/3 | val loss"), std::string::npos) << log;
}

}  // namespace
}  // namespace ham
