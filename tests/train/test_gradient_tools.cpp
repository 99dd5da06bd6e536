// The trainer's gradient inspection: grad_norms_every, dump_grads / dump_grads_at and the
// HAM router statistics, each checked against a direct computation on the same batch.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "core/safetensors.h"
#include "models/ham.h"
#include "models/transformer.h"
#include "tests/error_testing.h"
#include "tests/testing.h"
#include "train/gradient_monitor.h"
#include "train/trainer.h"

namespace ham {
namespace {

namespace fs = std::filesystem;

ModelConfig small_transformer() {
  ModelConfig c;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.d_ff = 48;
  return c;
}

// One step on a fixed text, no validation split, no MFU measurement.
TrainOptions one_step(const fs::path& log_dir) {
  TrainOptions opt;
  opt.steps = 1;
  opt.batch_size = 2;
  opt.seq_len = 16;
  opt.log_dir = log_dir.string();
  opt.peak_gflops = 1;
  return opt;
}

// The gradients of step 1 computed directly: the trainer's first batch (data generator
// seeded with opt.seed) through a model initialised the same way.
std::map<std::string, Tensor> first_step_gradients(LanguageModel& model, const TokenSource& data,
                                                   const TrainOptions& opt) {
  Generator gen(opt.seed);
  TokenBatch batch = data.sample(opt.batch_size, opt.seq_len, gen);
  backward(model.loss(batch));
  std::map<std::string, Tensor> grads;
  for (const auto& [name, p] : model.named_parameters()) {
    grads[name] = grad(p).defined() ? grad(p) : Tensor::zeros(p.shape(), p.dtype());
  }
  return grads;
}

double norm(const Tensor& t) {
  double sq = 0;
  for (double v : t.to_vector<double>()) sq += v * v;
  return std::sqrt(sq);
}

// The metrics.jsonl line holding `key`.
nlohmann::json metrics_line_with(const fs::path& log_dir, const std::string& key) {
  std::ifstream in(log_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains(key)) return j;
  }
  ADD_FAILURE() << "no metrics line holds " << key;
  return {};
}

TokenStream text_stream() {
  return TokenStream::from_text(default_corpus(), 0.0, "embedded").first;
}

// No validation windows: train() then skips its evaluations.
const TokenStream& no_validation() {
  static const TokenStream empty(std::vector<int64_t>{});
  return empty;
}

TEST(GradientTools, GlobMatch) {
  EXPECT_TRUE(glob_match("layers.*.mlp.up.weight", "layers.12.mlp.up.weight"));
  EXPECT_TRUE(glob_match("*", "embed.weight"));
  EXPECT_TRUE(glob_match("lm_head.weight", "lm_head.weight"));
  EXPECT_TRUE(glob_match("layers.?.attn.*", "layers.3.attn.q_proj.weight"));
  EXPECT_TRUE(glob_match("*.weight", "final_norm.weight"));
  EXPECT_FALSE(glob_match("layers.?.attn.*", "layers.13.attn.q_proj.weight"));
  EXPECT_FALSE(glob_match("lm_head", "lm_head.weight"));
  EXPECT_FALSE(glob_match("*.bias", "lm_head.weight"));
}

TEST(GradientTools, OptionsRoundTripAndOldJsonLoads) {
  TrainOptions opt;
  opt.grad_norms_every = 5;
  opt.dump_grads = {"layers.*.mlp.up.weight", "score_grad"};
  opt.dump_grads_at = {1, 10};
  TrainOptions back;
  back.update_from_json(opt.to_json(), "test");
  EXPECT_EQ(back.grad_norms_every, 5);
  EXPECT_EQ(back.dump_grads, opt.dump_grads);
  EXPECT_EQ(back.dump_grads_at, opt.dump_grads_at);
  // A checkpoint written before these options existed lacks the keys; resume merges its
  // options onto the defaults, so they load with the new options off.
  nlohmann::json old = TrainOptions{}.to_json();
  old["steps"] = 7;
  old.erase("grad_norms_every");
  old.erase("dump_grads");
  old.erase("dump_grads_at");
  TrainOptions from_old;
  from_old.update_from_json(old, "old state.json");
  EXPECT_EQ(from_old.steps, 7);
  EXPECT_EQ(from_old.grad_norms_every, 0);
  EXPECT_TRUE(from_old.dump_grads.empty());
  EXPECT_TRUE(from_old.dump_grads_at.empty());
  testing::expect_error([&] { back.update_from_json({{"dump_grads_at", {"one"}}}, "f.json"); },
                        {"f.json", "dump_grads_at"});
}

TEST(GradientTools, LoggedGradNormsMatchADirectComputation) {
  TokenStream data = text_stream();
  fs::path dir = testing::fresh_temp_dir("gradient_tools_norms");
  TrainOptions opt = one_step(dir);
  opt.grad_norms_every = 1;
  Transformer model(small_transformer());
  std::ostringstream log;
  train(model, data, no_validation(), opt, log);

  Transformer reference(small_transformer());
  std::map<std::string, Tensor> grads = first_step_gradients(reference, data, opt);
  nlohmann::json line = metrics_line_with(dir, "grad_norm/layer_0");
  std::map<int, double> layer_sq;
  for (const auto& [name, g] : grads) {
    double expected = norm(g);
    ASSERT_TRUE(line.contains("grad_norm/" + name)) << name;
    EXPECT_NEAR(line["grad_norm/" + name].get<double>(), expected, 1e-6 * expected + 1e-12) << name;
    if (name.rfind("layers.", 0) == 0) layer_sq[name[7] - '0'] += expected * expected;
  }
  ASSERT_EQ(layer_sq.size(), 2u);
  for (const auto& [layer, sq] : layer_sq) {
    std::string key = "grad_norm/layer_" + std::to_string(layer);
    EXPECT_NEAR(line[key].get<double>(), std::sqrt(sq), 1e-6 * std::sqrt(sq)) << key;
  }
  EXPECT_NE(log.str().find("grad norm by layer: 0:"), std::string::npos) << log.str();
  fs::remove_all(dir);
}

TEST(GradientTools, DumpHoldsExactlyTheRequestedGradients) {
  TokenStream data = text_stream();
  fs::path dir = testing::fresh_temp_dir("gradient_tools_dump");
  TrainOptions opt = one_step(dir);
  opt.dump_grads = {"layers.1.mlp.*", "lm_head.weight"};
  opt.dump_grads_at = {1};
  Transformer model(small_transformer());
  std::ostringstream log;
  train(model, data, no_validation(), opt, log);

  SafetensorsFile file = load_safetensors((dir / "grads" / "step-00000001.safetensors").string());
  std::vector<std::string> names;
  for (const auto& [name, t] : file.tensors) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.1.mlp.gate.weight", "layers.1.mlp.up.weight",
                                             "layers.1.mlp.down.weight", "lm_head.weight"}));
  EXPECT_EQ(file.metadata.at("step"), "1");
  Transformer reference(small_transformer());
  std::map<std::string, Tensor> grads = first_step_gradients(reference, data, opt);
  for (const auto& [name, t] : file.tensors) {
    EXPECT_EQ(t.dtype(), DType::F32) << name;
    EXPECT_EQ(t.to_vector<float>(), grads.at(name).to_vector<float>()) << name;
  }
  fs::remove_all(dir);
}

// A HAM model with a learned router (no EDA): router statistics are logged, and dL/de_t,
// dumped with the selection, is non-zero only on selected tokens (the value-scaling path).
TEST(GradientTools, RouterStatisticsAndScoreGradientsOfALearnedRouter) {
  ModelConfig config = ModelConfig::from_file(HAM_SOURCE_DIR "/configs/tiny/ham-learned-router.json");
  TokenStream data = text_stream();
  fs::path dir = testing::fresh_temp_dir("gradient_tools_router");
  TrainOptions opt = one_step(dir);
  opt.grad_norms_every = 1;
  opt.dump_grads = {"score_grad"};
  opt.dump_grads_at = {1};
  HAMModel model(config);
  std::ostringstream log;
  train(model, data, no_validation(), opt, log);

  SafetensorsFile file = load_safetensors((dir / "grads" / "step-00000001.safetensors").string());
  ASSERT_EQ(file.tensors.size(), 4u);  // score_grad and select of both layers
  // The direct computation: the same batch with dL/de_t retained.
  HAMModel reference(config);
  for (auto& block : reference.layers) block->mixer->retain_score_grad = true;
  first_step_gradients(reference, data, opt);
  nlohmann::json line = metrics_line_with(dir, "router/grad_norm/layer_0");
  for (int layer = 0; layer < 2; ++layer) {
    std::string prefix = "layers." + std::to_string(layer) + ".mixer.";
    const Tensor& score_grad = file.at(prefix + "score_grad");
    const Tensor& select = file.at(prefix + "select");
    EXPECT_EQ(score_grad.shape(), (Shape{2, 16}));
    const HAMLayerTrace& trace = reference.layers[size_t(layer)]->mixer->last_trace();
    EXPECT_EQ(select.to_vector<uint8_t>(), trace.select.to_vector<uint8_t>());
    EXPECT_EQ(score_grad.to_vector<float>(), grad(trace.score_in_graph).to_vector<float>());

    std::vector<float> g = score_grad.to_vector<float>();
    std::vector<uint8_t> m = select.to_vector<uint8_t>();
    int64_t nonzero = 0, selected = 0;
    double max_abs = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      if (!m[i]) {
        EXPECT_EQ(g[i], 0.0f) << prefix << " token " << i << " is not selected";
      }
      nonzero += g[i] != 0;
      selected += m[i];
      max_abs = std::max(max_abs, std::abs(double(g[i])));
    }
    EXPECT_GT(nonzero, 0) << prefix;
    EXPECT_GT(selected, 0) << prefix;
    std::string suffix = "/layer_" + std::to_string(layer);
    EXPECT_DOUBLE_EQ(line["router/score_grad/nonzero_fraction" + suffix].get<double>(),
                     double(nonzero) / double(g.size()));
    EXPECT_DOUBLE_EQ(line["router/score_grad/abs_max" + suffix].get<double>(), max_abs);
    double router_sq = 0;
    for (const auto& [name, p] : reference.layers[size_t(layer)]->mixer->router->named_parameters()) {
      router_sq += std::pow(norm(grad(p)), 2);
    }
    EXPECT_GT(router_sq, 0);
    EXPECT_NEAR(line["router/grad_norm" + suffix].get<double>(), std::sqrt(router_sq),
                1e-6 * std::sqrt(router_sq));
  }
  EXPECT_NE(log.str().find("router by layer: 0: grad norm"), std::string::npos) << log.str();
  fs::remove_all(dir);
}

TEST(GradientTools, PatternMatchingNothingIsAOneLineErrorNamingIt) {
  TokenStream data = text_stream();
  fs::path dir = testing::fresh_temp_dir("gradient_tools_bad_pattern");
  TrainOptions opt = one_step(dir);
  opt.dump_grads = {"lm_head.weight", "layers.7.*"};
  opt.dump_grads_at = {1};
  Transformer model(small_transformer());
  std::ostringstream log;
  testing::expect_error([&] { train(model, data, no_validation(), opt, log); },
                        {"dump_grads", "'layers.7.*'", "matches no parameter"});
  EXPECT_FALSE(fs::exists(dir / "grads"));
  // score_grad needs a learned router.
  opt.dump_grads = {"score_grad"};
  testing::expect_error([&] { train(model, data, no_validation(), opt, log); },
                        {"dump_grads", "score_grad", "learned router"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ham
