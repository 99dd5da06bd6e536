// Block hooks in one process: every family calls them in the documented order, in forward
// and in backward (activation recompute included), and a world-of-one Full sharded model
// gathered block by block through them gives the one-process loss and gradients while
// holding at most "rest" + two layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "distributed/flat_shard.h"
#include "distributed/sharded_block_hooks.h"
#include "models/language_model.h"
#include "tests/distributed/distributed_testing.h"
#include "tests/error_testing.h"

namespace ham::dist {
namespace {

using namespace ham::dist::testing;

ModelConfig tiny_config(const std::string& variant, int64_t n_layers, bool recompute) {
  ModelConfig config =
      ModelConfig::from_file(std::string(HAM_SOURCE_DIR) + "/configs/tiny/" + variant + ".json");
  config.n_layers = n_layers;
  config.recompute = recompute;
  return config;
}

TokenBatch random_batch(int64_t rows, int64_t length, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::vector<int64_t> inputs(size_t(rows * length)), targets(size_t(rows * length));
  for (auto& t : inputs) t = token(rng);
  for (auto& t : targets) t = token(rng);
  return TokenBatch{Tensor::from_vector(inputs, {rows, length}),
                    Tensor::from_vector(targets, {rows, length}), {}, {}};
}

// "F+0" before_forward(0), "F-0" after_forward(0), "B+" / "B-" for backward; "o" is the
// outer block (embedding, final norm and head).
class RecordingHooks final : public BlockHooks {
 public:
  explicit RecordingHooks(std::shared_ptr<BlockHooks> inner = nullptr) : inner_(std::move(inner)) {}
  void before_forward(int64_t b) override { record("F+", b, &BlockHooks::before_forward); }
  void after_forward(int64_t b) override { record("F-", b, &BlockHooks::after_forward); }
  void before_backward(int64_t b) override { record("B+", b, &BlockHooks::before_backward); }
  void after_backward(int64_t b) override { record("B-", b, &BlockHooks::after_backward); }
  std::string events;

 private:
  void record(const char* what, int64_t block, void (BlockHooks::*call)(int64_t)) {
    events += std::string(events.empty() ? "" : " ") + what +
              (block == kOuterBlock ? std::string("o") : std::to_string(block));
    if (inner_) (inner_.get()->*call)(block);
  }
  std::shared_ptr<BlockHooks> inner_;
};

std::string expected_events(int64_t n_layers) {
  std::string e = "F+o F-o";
  for (int64_t i = 0; i < n_layers; ++i) e += " F+" + std::to_string(i) + " F-" + std::to_string(i);
  e += " F+o F-o B+o B-o";
  for (int64_t i = n_layers - 1; i >= 0; --i) {
    e += " B+" + std::to_string(i) + " B-" + std::to_string(i);
  }
  return e + " B+o";
}

const char* const kVariants[] = {"transformer", "gdn", "gdn-gsa", "ham-learned-tau",
                                 "ham-learned-router-eda"};

TEST(BlockHooks, EveryFamilyCallsThemInLayerOrderForwardAndBackward) {
  for (const char* variant : kVariants) {
    for (bool recompute : {false, true}) {
      auto model = make_model(tiny_config(variant, 3, recompute));
      auto hooks = std::make_shared<RecordingHooks>();
      model->set_block_hooks(hooks);
      TokenBatch batch = random_batch(2, 16, model->config().vocab_size, 7);
      Tensor loss = model->loss(batch);
      backward(loss);
      EXPECT_EQ(hooks->events, expected_events(3)) << variant << (recompute ? " recompute" : "");
      // Without grad mode (evaluation) only the forward calls come.
      hooks->events.clear();
      {
        NoGradGuard no_grad;
        model->loss(batch);
      }
      EXPECT_EQ(hooks->events, "F+o F-o F+0 F-0 F+1 F-1 F+2 F-2 F+o F-o") << variant;
    }
  }
}

TEST(BlockHooks, ChangeNothingInTheLossOrTheGradients) {
  for (const char* variant : kVariants) {
    ModelConfig config = tiny_config(variant, 2, false);
    auto plain = make_model(config), hooked = make_model(config);
    hooked->set_block_hooks(std::make_shared<RecordingHooks>());
    TokenBatch batch = random_batch(2, 16, config.vocab_size, 11);
    Tensor plain_loss = plain->loss(batch), hooked_loss = hooked->loss(batch);
    EXPECT_EQ(plain_loss.item(), hooked_loss.item()) << variant;
    backward(plain_loss);
    backward(hooked_loss);
    auto expected = plain->named_parameters();
    auto got = hooked->named_parameters();
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(max_abs_difference(grad(expected[i].second), grad(got[i].second)), 0.0)
          << variant << " " << expected[i].first;
    }
  }
}

// A world-of-one Full sharded model, gathered block by block: the one-process loss and
// mean gradient, "rest" + two layers gathered at most.
TEST(ShardedBlockHooks, GatherBlockByBlockAndMatchOneProcess) {
  for (const char* variant : kVariants) {
    for (bool recompute : {false, true}) {
      const std::string what = std::string(variant) + (recompute ? " recompute" : "");
      ModelConfig config = tiny_config(variant, 6, recompute);
      auto reference = make_model(config);
      auto model = make_model(config);
      ShardedModel sharded(group_parameters_by_layer(model->named_parameters()),
                           single_process_groups(), ShardingStage::Full);
      auto order = std::make_shared<RecordingHooks>(
          std::make_shared<ShardedBlockHooks>(sharded, config.n_layers));
      model->set_block_hooks(order);
      for (uint64_t micro = 0; micro < 2; ++micro) {  // gradients add up over micro-batches
        TokenBatch batch = random_batch(2, 16, config.vocab_size, 20 + micro);
        Tensor reference_loss = reference->loss(batch);
        backward(reference_loss);
        Tensor loss = model->loss(batch);
        EXPECT_EQ(loss.item(), reference_loss.item()) << what;
        sharded.begin_backward();
        backward(loss);
        sharded.finish_backward();
        EXPECT_EQ(sharded.gathered_parameter_bytes_now(), 0) << what;
      }
      std::map<std::string, Tensor> expected;
      for (const auto& [name, p] : reference->named_parameters()) expected[name] = grad(p);
      for (const auto& [name, g] : sharded.full_gradients()) {
        EXPECT_EQ(max_abs_difference(g, expected.at(name)), 0.0) << what << " " << name;
      }
      // Peak: "rest" + two adjacent layers (the running one and the prefetched one).
      std::vector<int64_t> layer_bytes;
      int64_t rest_bytes = 0;
      for (size_t b = 0; b < sharded.num_blocks(); ++b) {
        const ShardedBlock& block = sharded.block(b);
        if (block.name() == "rest") {
          rest_bytes = block.gathered_parameter_bytes();
        } else {
          layer_bytes.push_back(block.gathered_parameter_bytes());
        }
      }
      int64_t pair = 0;
      for (size_t i = 1; i < layer_bytes.size(); ++i) {
        pair = std::max(pair, layer_bytes[i - 1] + layer_bytes[i]);
      }
      EXPECT_EQ(sharded.peak_gathered_parameter_bytes(), rest_bytes + pair) << what;
      EXPECT_LT(sharded.peak_gathered_parameter_bytes(), sharded.full_parameter_bytes() / 2) << what;
      EXPECT_EQ(sharded.memory_per_rank().parameters, sharded.peak_gathered_parameter_bytes()) << what;
      model->set_block_hooks(nullptr);
    }
  }
}

TEST(ShardedBlockHooks, NeedFullShardingAndTheModelsLayers) {
  ModelConfig config = tiny_config("transformer", 2, false);
  auto model = make_model(config);
  ShardedModel replicated(group_parameters_by_layer(model->named_parameters()),
                          single_process_groups(), ShardingStage::GradientsAndOptimizer);
  ham::testing::expect_error([&] { ShardedBlockHooks hooks(replicated, 2); },
                             {"sharded block hooks", "grads+optimizer", "full"});
  auto other = make_model(config);
  ShardedModel full(group_parameters_by_layer(other->named_parameters()),
                    single_process_groups(), ShardingStage::Full);
  ham::testing::expect_error([&] { ShardedBlockHooks hooks(full, 3); },
                             {"sharded model", "layers.2"});
  full.gather_all();
}

}  // namespace
}  // namespace ham::dist
