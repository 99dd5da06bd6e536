// Flat-buffer sharding in one process: the layout arithmetic for any number of shards, the
// block grouping, both stages' parameter binding, the gradient paths and the sharded
// AdamW against nn's AdamW (bit for bit with one rank), and sharded checkpoints.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "autograd/engine.h"
#include "core/ops/elementwise.h"
#include "core/ops/optim.h"
#include "distributed/flat_shard.h"
#include "distributed/sharded_checkpoint.h"
#include "nn/elementwise.h"
#include "nn/optim.h"
#include "nn/reduce.h"
#include "tests/distributed/distributed_testing.h"
#include "tests/error_testing.h"

namespace ham::dist {
namespace {

using ham::testing::expect_error;
using namespace ham::dist::testing;

TEST(FlatLayout, PadsToAMultipleOfTheShardCountAndSplitsParameters) {
  // numels 15, 7, 12, 1, 11 = 46 elements.
  FlatLayout layout(awkward_shapes(), 4);
  EXPECT_EQ(layout.numel(), 46);
  EXPECT_EQ(layout.shard_numel(), 12);  // ceil(46 / 4)
  EXPECT_EQ(layout.padded_numel(), 48);
  EXPECT_EQ(layout.entries()[2].offset, 22);
  // Shard 1 is [12, 24): the last 3 of "rest.embed", all 7 of "layers.0.w", the first 2
  // of "layers.0.u".
  auto s1 = layout.segments(1);
  ASSERT_EQ(s1.size(), 3u);
  EXPECT_EQ(s1[0].entry, 0u);
  EXPECT_EQ(s1[0].offset_in_param, 12);
  EXPECT_EQ(s1[0].offset_in_shard, 0);
  EXPECT_EQ(s1[0].numel, 3);
  EXPECT_EQ(s1[1].entry, 1u);
  EXPECT_EQ(s1[1].offset_in_shard, 3);
  EXPECT_EQ(s1[1].numel, 7);
  EXPECT_EQ(s1[2].entry, 2u);
  EXPECT_EQ(s1[2].offset_in_param, 0);
  EXPECT_EQ(s1[2].numel, 2);
  // Shard 3 is [36, 48): the last 10 of "layers.1.v"; 2 elements of padding.
  auto s3 = layout.segments(3);
  ASSERT_EQ(s3.size(), 1u);
  EXPECT_EQ(s3[0].entry, 4u);
  EXPECT_EQ(s3[0].offset_in_param, 1);
  EXPECT_EQ(s3[0].numel, 10);
  // Every element lands in exactly one shard, for any shard count.
  for (int n = 1; n <= 50; ++n) {
    FlatLayout l(awkward_shapes(), n);
    int64_t covered = 0;
    for (int s = 0; s < n; ++s) {
      for (const auto& seg : l.segments(s)) covered += seg.numel;
    }
    EXPECT_EQ(covered, 46) << n << " shards";
    EXPECT_EQ(l.padded_numel() % n, 0);
    EXPECT_LT(l.padded_numel() - l.numel(), n);
  }
  expect_error([] { FlatLayout(awkward_shapes(), 0); }, {"flat layout", "shards", "0"});
  expect_error([] { FlatLayout(awkward_shapes(), 2).segments(2); }, {"shard 2", "2 shards"});
}

TEST(GroupParametersByLayer, RestFirstThenLayersInNumericOrder) {
  std::vector<std::pair<std::string, Tensor>> named;
  for (const char* name : {"embed.weight", "layers.10.w", "layers.2.w", "layers.2.v",
                           "final_norm.weight", "layersX.w", "lm_head.weight"}) {
    named.emplace_back(name, Tensor::zeros({1}));
  }
  auto blocks = group_parameters_by_layer(named);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].name, "rest");
  ASSERT_EQ(blocks[0].parameters.size(), 4u);
  EXPECT_EQ(blocks[0].parameters[2].first, "layersX.w");
  EXPECT_EQ(blocks[1].name, "layers.2");
  EXPECT_EQ(blocks[1].parameters.size(), 2u);
  EXPECT_EQ(blocks[2].name, "layers.10");
}

// Mixed precision keeps a few parameters f32 in a bf16 model: one flat buffer per dtype.
TEST(GroupParametersByLayer, MixedDtypesSplitIntoAdjacentBlocks) {
  std::vector<std::pair<std::string, Tensor>> named = {
      {"embed.weight", Tensor::zeros({4, 2}, DType::BF16)},
      {"layers.0.a", Tensor::zeros({3}, DType::BF16)},
      {"layers.0.gate", Tensor::zeros({2}, DType::F32)},
      {"layers.0.b", Tensor::zeros({5}, DType::BF16)},
      {"layers.1.a", Tensor::zeros({3}, DType::BF16)}};
  auto blocks = group_parameters_by_layer(named);
  ASSERT_EQ(blocks.size(), 4u);
  EXPECT_EQ(blocks[0].name, "rest");
  EXPECT_EQ(blocks[1].name, "layers.0");
  ASSERT_EQ(blocks[1].parameters.size(), 2u);
  EXPECT_EQ(blocks[1].parameters[1].first, "layers.0.b");
  EXPECT_EQ(blocks[2].name, "layers.0:f32");
  ASSERT_EQ(blocks[2].parameters.size(), 1u);
  EXPECT_EQ(blocks[2].parameters[0].first, "layers.0.gate");
  EXPECT_EQ(blocks[3].name, "layers.1");
  ShardedModel model(std::move(blocks), single_process_groups(), ShardingStage::Full);
  EXPECT_EQ(model.block(2).parameter_dtype(), DType::F32);
  EXPECT_EQ(model.block(2).master_dtype(), DType::F32);
  EXPECT_EQ(model.block(1).master_dtype(), DType::F32);  // bf16 parameters, f32 masters
  auto masters = model.full_master_parameters();
  ASSERT_EQ(masters.size(), 5u);
  for (const auto& [name, t] : masters) EXPECT_EQ(t.dtype(), DType::F32) << name;
}

TEST(ShardingStage, ParsesAndNamesTheStages) {
  EXPECT_EQ(parse_sharding_stage("full"), ShardingStage::Full);
  EXPECT_EQ(parse_sharding_stage("zero2"), ShardingStage::GradientsAndOptimizer);
  EXPECT_STREQ(sharding_stage_name(ShardingStage::GradientsAndOptimizer), "grads+optimizer");
  expect_error([] { parse_sharding_stage("zero1"); }, {"sharding stage", "zero1", "full"});
}

std::vector<ParameterBlock> blocks_of(const std::vector<std::pair<std::string, Tensor>>& params) {
  return group_parameters_by_layer(params);
}

TEST(ShardedModel, GradientsAndOptimizerStageKeepsParametersAsViewsOfOneBuffer) {
  auto params = make_parameters(awkward_shapes(), 10);
  auto original = clone_parameters(params);
  ShardedModel model(blocks_of(params), single_process_groups(), ShardingStage::GradientsAndOptimizer);
  ASSERT_EQ(model.num_blocks(), 3u);
  EXPECT_EQ(model.block(0).name(), "rest");
  // Same values; the two parameters of layers.0 now share one storage.
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(max_abs_difference(params[i].second, original[i].second), 0) << params[i].first;
  }
  EXPECT_TRUE(params[1].second.shares_storage_with(params[2].second));
  EXPECT_TRUE(model.block(1).master_shard().shares_storage_with(params[1].second));
  auto full = model.full_parameters();
  ASSERT_EQ(full.size(), params.size());
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(full[i].first, original[i].first);
    EXPECT_EQ(max_abs_difference(full[i].second, original[i].second), 0);
  }
}

TEST(ShardedModel, FullStageReleasesAndGathersParameters) {
  auto params = make_parameters(awkward_shapes(), 20);
  auto original = clone_parameters(params);
  ShardedModel model(blocks_of(params), single_process_groups(), ShardingStage::Full);
  for (size_t b = 0; b < model.num_blocks(); ++b) EXPECT_FALSE(model.block(b).gathered());
  EXPECT_EQ(params[0].second.impl()->storage->nbytes(), 0u);  // released: no memory
  model.prefetch(1);
  model.gather(1);
  EXPECT_TRUE(model.block(1).gathered());
  EXPECT_EQ(max_abs_difference(params[1].second, original[1].second), 0);
  EXPECT_EQ(max_abs_difference(params[2].second, original[2].second), 0);
  model.release(1);
  EXPECT_FALSE(model.block(1).gathered());
  model.gather_all();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(max_abs_difference(params[i].second, original[i].second), 0) << params[i].first;
  }
  model.release_all();
  auto full = model.full_parameters();  // works while released
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(max_abs_difference(full[i].second, original[i].second), 0);
  }
}

TEST(ShardedModel, RefusesMixedDtypesAndEmptyBlocks) {
  auto params = make_parameters(awkward_shapes(), 30);
  params[2].second = params[2].second.to(DType::F64);
  // group_parameters_by_layer splits by dtype; a block made by hand must hold one.
  std::vector<ParameterBlock> mixed = {{"layers.0", {params[1], params[2]}}};
  expect_error([&] { ShardedModel(mixed, single_process_groups(), ShardingStage::Full); },
               {"sharded block 'layers.0'", "layers.0.u", "f64", "one dtype and device"});
  expect_error([] { ShardedModel({}, single_process_groups(), ShardingStage::Full); },
               {"sharded model", "no parameter blocks"});
}

// loss = sum_i sum(p_i * c_i) with fixed c_i: dL/dp_i = c_i, known by hand.
Tensor weighted_sum(const std::vector<std::pair<std::string, Tensor>>& params,
                    const std::vector<Tensor>& weights) {
  Tensor total;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor term = sum(mul(params[i].second, weights[i]));
    total = total.defined() ? add(total, term) : term;
  }
  return total;
}

std::vector<Tensor> fixed_weights(const std::vector<std::pair<std::string, Shape>>& shapes,
                                  uint64_t seed) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < shapes.size(); ++i) out.push_back(rank_tensor(seed + i, 0, shapes[i].second, DType::F32));
  return out;
}

// The gradient shards, concatenated, cut back to each parameter.
std::map<std::string, Tensor> gradients_from_shards(ShardedModel& model) {
  std::map<std::string, Tensor> out;
  for (size_t b = 0; b < model.num_blocks(); ++b) {
    const ShardedBlock& block = model.block(b);
    for (const FlatEntry& e : block.layout().entries()) {
      out[e.name] = block.gradient_shard().slice(e.offset, e.offset + e.numel).reshape(e.shape);
    }
  }
  return out;
}

TEST(ShardedModel, BackwardHooksFlattenAndScatterEveryBlock) {
  for (ShardingStage stage : {ShardingStage::GradientsAndOptimizer, ShardingStage::Full}) {
    auto params = make_parameters(awkward_shapes(), 40);
    auto weights = fixed_weights(awkward_shapes(), 50);
    ShardedModel model(blocks_of(params), single_process_groups(), stage);
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
      model.gather_all();
      Tensor loss = weighted_sum(params, weights);
      model.begin_backward();
      backward(loss);
      model.finish_backward();
    }
    // Two micro-batches accumulate: 2 c_i; grad() is left empty.
    auto grads = gradients_from_shards(model);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_FALSE(grad(params[i].second).defined()) << params[i].first;
      auto got = grads.at(params[i].first).to_vector<float>();
      auto want = weights[i].to_vector<float>();
      for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k], 2 * want[k]);
    }
    if (stage == ShardingStage::Full) {
      for (size_t b = 0; b < model.num_blocks(); ++b) EXPECT_FALSE(model.block(b).gathered());
    }
    model.zero_gradients();
    EXPECT_EQ(model.gradient_norm(), 0.0);
  }
}

TEST(ShardedModel, UnusedParametersCountAsZeroAndStrayGradientsAreRefused) {
  auto params = make_parameters(awkward_shapes(), 60);
  auto weights = fixed_weights(awkward_shapes(), 70);
  ShardedModel model(blocks_of(params), single_process_groups(), ShardingStage::Full);
  model.gather_all();
  // Only the first two parameters take part: blocks "rest" and "layers.0" stay incomplete.
  std::vector<std::pair<std::string, Tensor>> used(params.begin(), params.begin() + 2);
  model.begin_backward();
  backward(weighted_sum(used, weights));
  model.finish_backward();
  auto grads = gradients_from_shards(model);
  EXPECT_EQ(max_abs_difference(grads.at("layers.0.w"), weights[1]), 0);
  EXPECT_EQ(ops::squared_norm(grads.at("layers.0.u")), 0.0);
  EXPECT_EQ(ops::squared_norm(grads.at("layers.1.v")), 0.0);

  model.gather_all();
  backward(weighted_sum(used, weights));  // outside begin/finish: lands in grad()
  expect_error([&] { model.begin_backward(); },
               {"begin_backward", "rest.embed", "already has a gradient"});
  model.reduce_scatter_gradients();  // the explicit path takes it
  EXPECT_EQ(max_abs_difference(gradients_from_shards(model).at("layers.0.w"),
                               ops::scaled(weights[1], 2.0)), 0);
}

TEST(ShardedModel, ClipsTheGlobalNormAndNamesNonFiniteGradients) {
  auto params = make_parameters(awkward_shapes(), 80);
  auto weights = fixed_weights(awkward_shapes(), 90);
  ShardedModel model(blocks_of(params), single_process_groups(), ShardingStage::GradientsAndOptimizer);
  model.begin_backward();
  backward(weighted_sum(params, weights));
  model.finish_backward();
  double expected = 0;
  for (const Tensor& w : weights) expected += ops::squared_norm(w);
  expected = std::sqrt(expected);
  EXPECT_NEAR(model.clip_gradient_norm(1.0), expected, 1e-12 * expected);
  EXPECT_NEAR(model.gradient_norm(), 1.0, 1e-6);
  EXPECT_EQ(model.first_non_finite_gradient(), "");
  Tensor shard = model.block(2).gradient_shard();
  shard.fill_(NAN);
  EXPECT_EQ(model.first_non_finite_gradient(), "layers.1.b");
  EXPECT_TRUE(std::isnan(model.clip_gradient_norm(1.0)));
}

// nn's AdamW on the full parameters and the sharded one on a world of one see the same
// gradients (clipped the same way): the parameters agree bit for bit, both stages.
TEST(ShardedAdamW, MatchesAdamWOnOneRankBitForBit) {
  for (ShardingStage stage : {ShardingStage::GradientsAndOptimizer, ShardingStage::Full}) {
    auto sharded_params = make_parameters(awkward_shapes(), 100);
    auto reference_params = clone_parameters(sharded_params);
    ShardedModel model(blocks_of(sharded_params), single_process_groups(), stage);
    AdamW::Options options{1e-2, 0.9, 0.95, 1e-8};
    auto reference_groups = decay_groups(reference_params, 0.1);
    reference_groups[1].lr_scale = 0.5;
    AdamW reference(reference_groups, options);
    auto sharded_groups = decay_groups(sharded_params, 0.1);
    sharded_groups[1].lr_scale = 0.5;
    ShardedAdamW sharded_scaled(model, sharded_groups, options);
    for (int step = 0; step < 4; ++step) {
      auto weights = fixed_weights(awkward_shapes(), 200 + 10 * step);
      model.gather_all();
      model.begin_backward();
      backward(weighted_sum(sharded_params, weights));
      model.finish_backward();
      backward(weighted_sum(reference_params, weights));
      double max_norm = 3.0;  // below the norm: clipping acts
      double norm = model.clip_gradient_norm(max_norm);
      std::vector<Tensor> reference_tensors;
      for (auto& [name, p] : reference_params) reference_tensors.push_back(p);
      EXPECT_NEAR(norm, clip_grad_norm(reference_tensors, max_norm), 1e-12 * norm);
      double lr = 0.01 * (step + 1);
      sharded_scaled.step(lr);
      reference.step(lr);
      reference.zero_grad();
      model.zero_gradients();
    }
    model.gather_all();
    for (size_t i = 0; i < sharded_params.size(); ++i) {
      EXPECT_EQ(max_abs_difference(sharded_params[i].second, reference_params[i].second), 0)
          << sharded_params[i].first << " (" << sharding_stage_name(stage) << ")";
    }
    EXPECT_EQ(sharded_scaled.steps_taken(), 4);
  }
}

TEST(ShardedAdamW, EveryParameterNeedsExactlyOneGroup) {
  auto params = make_parameters(awkward_shapes(), 110);
  ShardedModel model(blocks_of(params), single_process_groups(), ShardingStage::Full);
  auto groups = decay_groups(params, 0.1);
  auto missing = groups;
  missing[0].params.pop_back();
  expect_error([&] { ShardedAdamW(model, missing, {}); }, {"sharded AdamW", "in no parameter group"});
  auto twice = groups;
  twice[1].params.push_back(twice[0].params[0]);
  expect_error([&] { ShardedAdamW(model, twice, {}); }, {"sharded AdamW", "in two groups"});
}

TEST(ShardedCheckpoint, RoundTripsAndRefusesAnotherModel) {
  auto params = make_parameters(awkward_shapes(), 120);
  ShardedModel model(blocks_of(params), single_process_groups(), ShardingStage::GradientsAndOptimizer);
  ShardedAdamW optimizer(model, decay_groups(params, 0.1), {});
  auto weights = fixed_weights(awkward_shapes(), 130);
  model.begin_backward();
  backward(weighted_sum(params, weights));
  model.finish_backward();
  optimizer.step(1e-2);
  std::string dir = std::filesystem::temp_directory_path() /
                    ("ham_sharded_ckpt_" + std::to_string(::getpid()));
  save_sharded_checkpoint(dir, optimizer);
  EXPECT_TRUE(std::filesystem::exists(dir + "/" + sharded_checkpoint_file_name(0, 1)));

  auto fresh = make_parameters(awkward_shapes(), 140);
  ShardedModel other(blocks_of(fresh), single_process_groups(), ShardingStage::Full);
  ShardedAdamW other_optimizer(other, decay_groups(fresh, 0.1), {});
  EXPECT_EQ(load_sharded_checkpoint(dir, other_optimizer), 1);
  other.gather_all();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(max_abs_difference(fresh[i].second, params[i].second), 0) << params[i].first;
  }
  for (size_t b = 0; b < model.num_blocks(); ++b) {
    EXPECT_EQ(max_abs_difference(other_optimizer.exp_avg_sq(b), optimizer.exp_avg_sq(b)), 0);
  }

  auto shapes = awkward_shapes();
  shapes[4].second = {12};
  auto different = make_parameters(shapes, 150);
  ShardedModel wrong(blocks_of(different), single_process_groups(), ShardingStage::Full);
  ShardedAdamW wrong_optimizer(wrong, decay_groups(different, 0.1), {});
  expect_error([&] { load_sharded_checkpoint(dir, wrong_optimizer); },
               {"shard-0000-of-0001.safetensors", "block 'layers.1'", "layers.1.v[12]"});
  std::filesystem::remove_all(dir);
  expect_error([&] { load_sharded_checkpoint(dir, optimizer); }, {"sharded checkpoint", dir});
}

TEST(ShardedModel, MemoryReportCountsShardsAndStages) {
  auto params = make_parameters(awkward_shapes(), 160);
  ShardedModel zero2(blocks_of(params), single_process_groups(), ShardingStage::GradientsAndOptimizer);
  ShardMemoryReport r = zero2.memory_per_rank();
  // One rank: blocks of 15, 19 and 12 f32 elements, no padding.
  EXPECT_EQ(r.parameters, 46 * 4);
  EXPECT_EQ(r.master, 0);  // a view of the parameters
  EXPECT_EQ(r.gradients, 46 * 4);
  EXPECT_EQ(r.optimizer, 2 * 46 * 4);
  auto more = make_parameters(awkward_shapes(), 170);
  ShardedModel full(blocks_of(more), single_process_groups(), ShardingStage::Full);
  ShardMemoryReport f = full.memory_per_rank();
  EXPECT_EQ(f.parameters, (15 + 19 + 12) * 4);  // rest + the two layers
  EXPECT_EQ(f.master, 46 * 4);
}

}  // namespace
}  // namespace ham::dist
