// Flat-buffer sharding across the ranks of mpirun: gather/scatter round trips, gradient
// averaging through the backward hooks, sharded AdamW against nn's AdamW on one process,
// and checkpoints resumed on a different number of ranks (N -> 1 and 1 -> N).
//
// Bound for sharded vs unsharded AdamW: the mean gradient is summed by MPI in f32 in its
// own order (exact for 2 ranks: a + b rounds once either way, and * 1/2 is exact), and the
// clipping norm is summed in double in another grouping; AdamW's update is scale-free in
// the gradient, so after a few steps parameters agree to |diff| <= 1e-6 (1 + |p|).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "autograd/engine.h"
#include "distributed/flat_shard.h"
#include "distributed/sharded_checkpoint.h"
#include "nn/elementwise.h"
#include "nn/reduce.h"
#include "tests/distributed/distributed_testing.h"
#include "tests/distributed/mpi/mpi_world.h"
#include "tests/error_testing.h"

namespace ham::dist {
namespace {

using ham::testing::expect_error;
using namespace ham::dist::testing;

const ShardingStage kStages[] = {ShardingStage::GradientsAndOptimizer, ShardingStage::Full};

ShardingGroups world_groups() {
  return make_sharding_groups(world_slot(), world().size());
}

// loss = sum_i sum(p_i * c_i^rank): each rank's gradient is its own c^rank.
Tensor weighted_sum(const std::vector<std::pair<std::string, Tensor>>& params,
                    const std::vector<Tensor>& weights) {
  Tensor total;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor term = sum(mul(params[i].second, weights[i]));
    total = total.defined() ? add(total, term) : term;
  }
  return total;
}

std::vector<Tensor> rank_weights(uint64_t seed, int rank) {
  std::vector<Tensor> out;
  auto shapes = awkward_shapes();
  for (size_t i = 0; i < shapes.size(); ++i) {
    out.push_back(rank_tensor(seed + 31 * i, rank, shapes[i].second, DType::F32));
  }
  return out;
}

// The mean over ranks of each rank's weights, rounded to f32 once.
std::vector<Tensor> mean_weights(uint64_t seed) {
  const int n = world().size();
  std::vector<std::vector<double>> sums;
  for (int r = 0; r < n; ++r) {
    auto w = rank_weights(seed, r);
    if (sums.empty()) sums.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      auto v = w[i].to_vector<double>();
      if (sums[i].empty()) sums[i].assign(v.size(), 0.0);
      for (size_t k = 0; k < v.size(); ++k) sums[i][k] += v[k] / n;
    }
  }
  std::vector<Tensor> out;
  auto shapes = awkward_shapes();
  for (size_t i = 0; i < sums.size(); ++i) {
    out.push_back(Tensor::from_vector(sums[i], shapes[i].second).to(DType::F32));
  }
  return out;
}

TEST(MpiSharding, GatherAndShardsRoundTripInBothStages) {
  for (ShardingStage stage : kStages) {
    auto params = make_parameters(awkward_shapes(), 1000);
    auto original = clone_parameters(params);
    ShardedModel model(group_parameters_by_layer(params), world_groups(), stage);
    // This rank's master shard holds exactly its range of the flat parameters.
    for (size_t b = 0; b < model.num_blocks(); ++b) {
      const ShardedBlock& block = model.block(b);
      EXPECT_EQ(block.shard_index(), world().rank());
      auto shard = block.master_shard().to_vector<double>();
      std::vector<double> want(size_t(block.layout().shard_numel()), 0.0);  // padding: 0
      for (const ShardSegment& s : block.layout().segments(block.shard_index())) {
        const std::string& name = block.layout().entries()[s.entry].name;
        Tensor full;
        for (const auto& [n, p] : original) {
          if (n == name) full = p;
        }
        auto values = full.to_vector<double>();
        for (int64_t k = 0; k < s.numel; ++k) {
          want[size_t(s.offset_in_shard + k)] = values[size_t(s.offset_in_param + k)];
        }
      }
      EXPECT_EQ(shard, want) << block.name() << " " << sharding_stage_name(stage);
    }
    model.gather_all();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(max_abs_difference(params[i].second, original[i].second), 0) << params[i].first;
    }
    auto full = model.full_parameters();
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_EQ(max_abs_difference(full[i].second, original[i].second), 0) << full[i].first;
    }
  }
}

TEST(MpiSharding, ReplicasThatDifferAreRefusedOnEveryRank) {
  auto params = make_parameters(awkward_shapes(), 1100);
  Tensor first = params[0].second;
  first.fill_(1.0 + world().rank());  // a different model on each rank
  expect_error([&] { ShardedModel(group_parameters_by_layer(params), world_groups(), ShardingStage::Full); },
               {"sharded block 'rest'", "parameters differ across the ranks of world", "same seed"});
}

TEST(MpiSharding, HooksAverageGradientsOverRanks) {
  for (ShardingStage stage : kStages) {
    auto params = make_parameters(awkward_shapes(), 1200);
    ShardedModel model(group_parameters_by_layer(params), world_groups(), stage);
    model.gather_all();
    model.begin_backward();
    backward(weighted_sum(params, rank_weights(1300, world().rank())));
    model.finish_backward();
    auto mean = mean_weights(1300);
    for (size_t b = 0; b < model.num_blocks(); ++b) {
      const ShardedBlock& block = model.block(b);
      for (const ShardSegment& s : block.layout().segments(block.shard_index())) {
        const std::string& name = block.layout().entries()[s.entry].name;
        size_t index = 0;
        while (params[index].first != name) ++index;
        auto want = mean[index].to_vector<double>();
        auto got = block.gradient_shard().to_vector<double>();
        for (int64_t k = 0; k < s.numel; ++k) {
          EXPECT_NEAR(got[size_t(s.offset_in_shard + k)], want[size_t(s.offset_in_param + k)],
                      1e-6)
              << name << "[" << s.offset_in_param + k << "] " << sharding_stage_name(stage);
        }
      }
    }
    // The global norm is the norm of the mean gradient.
    double want_norm = 0;
    for (const Tensor& w : mean) want_norm += ops::squared_norm(w);
    EXPECT_NEAR(model.gradient_norm(), std::sqrt(want_norm), 1e-5);
  }
}

// Sharded AdamW over `groups` against nn's AdamW given the mean gradient over all ranks.
void expect_sharded_adamw_matches_one_process(ShardingGroups (*make_groups)(),
                                              const std::string& label) {
  for (ShardingStage stage : kStages) {
    auto params = make_parameters(awkward_shapes(), 1400);
    auto reference = clone_parameters(params);
    ShardedModel model(group_parameters_by_layer(params), make_groups(), stage);
    AdamW::Options options{1e-2, 0.9, 0.95, 1e-8};
    ShardedAdamW sharded(model, decay_groups(params, 0.1), options);
    AdamW unsharded(decay_groups(reference, 0.1), options);
    std::vector<Tensor> reference_tensors;
    for (auto& [name, p] : reference) reference_tensors.push_back(p);
    for (int step = 0; step < 5; ++step) {
      uint64_t seed = 1500 + 100 * step;
      model.gather_all();
      model.begin_backward();
      backward(weighted_sum(params, rank_weights(seed, world().rank())));
      model.finish_backward();
      auto mean = mean_weights(seed);
      for (size_t i = 0; i < reference.size(); ++i) set_grad(reference[i].second, mean[i]);
      double norm = model.clip_gradient_norm(2.0);
      EXPECT_NEAR(norm, clip_grad_norm(reference_tensors, 2.0), 1e-5 * norm);
      sharded.step(1e-2);
      unsharded.step(1e-2);
      unsharded.zero_grad();
      model.zero_gradients();
    }
    auto full = model.full_parameters();
    double worst = 0;
    for (size_t i = 0; i < full.size(); ++i) {
      auto got = full[i].second.to_vector<double>(), want = reference[i].second.to_vector<double>();
      for (size_t k = 0; k < got.size(); ++k) {
        double diff = std::abs(got[k] - want[k]);
        worst = std::max(worst, diff);
        EXPECT_LE(diff, 1e-6 * (1 + std::abs(want[k]))) << full[i].first << "[" << k << "]";
      }
    }
    if (world().rank() == 0) {
      std::printf("sharded AdamW (%s, %s) on %d ranks vs AdamW on 1: max |diff| = %.3g "
                  "after 5 steps\n",
                  sharding_stage_name(stage), label.c_str(), world().size(), worst);
    }
  }
}

TEST(MpiSharding, ShardedAdamWMatchesAdamWOnOneProcess) {
  expect_sharded_adamw_matches_one_process(world_groups, "sharded over all ranks");
}

ShardingGroups pairs_of_ranks() { return make_sharding_groups(world_slot(), 2); }

TEST(HybridSharding, GroupsShardWithinPairsAndReplicateAcross) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks (ctest: distributed.mpi_np4_hybrid)";
  const int rank = world().rank();
  ShardingGroups groups = pairs_of_ranks();
  EXPECT_EQ(groups.shard->size(), 2);
  EXPECT_EQ(groups.shard->rank(), rank % 2);
  EXPECT_EQ(groups.replica->size(), 2);
  EXPECT_EQ(groups.replica->rank(), rank / 2);
  EXPECT_EQ(groups.shard_gradients->rank(), groups.shard->rank());
  // Shard group of rank r: {2g, 2g + 1}, g = r / 2; replica group: {r % 2, r % 2 + 2}.
  EXPECT_DOUBLE_EQ(groups.shard->all_reduce_scalar(rank, ReduceOp::Sum), 4 * (rank / 2) + 1);
  EXPECT_DOUBLE_EQ(groups.replica->all_reduce_scalar(rank, ReduceOp::Sum), 2 * (rank % 2) + 2);
  EXPECT_DOUBLE_EQ(groups.shard_gradients->all_reduce_scalar(rank, ReduceOp::Sum),
                   4 * (rank / 2) + 1);
}

TEST(HybridSharding, ShardedAdamWMatchesAdamWOnOneProcess) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks (ctest: distributed.mpi_np4_hybrid)";
  expect_sharded_adamw_matches_one_process(pairs_of_ranks, "hybrid: 2 shards x 2 replicas");
}

// A directory every rank agrees on (rank 0's pid).
std::string shared_directory(const std::string& stem) {
  Tensor pid = Tensor::full({1}, double(::getpid()), DType::I64);
  world().broadcast(pid, 0);
  return (std::filesystem::temp_directory_path() /
          (stem + std::to_string(int64_t(pid.item()))))
      .string();
}

// Full moments, for comparing runs on different numbers of ranks.
std::vector<std::vector<double>> full_moments(ShardedAdamW& optimizer, bool squared) {
  ShardedModel& model = optimizer.model();
  std::vector<std::vector<double>> out;
  for (size_t b = 0; b < model.num_blocks(); ++b) {
    const ShardedBlock& block = model.block(b);
    const Tensor& shard = squared ? optimizer.exp_avg_sq(b) : optimizer.exp_avg(b);
    Tensor full = Tensor::empty({block.layout().padded_numel()}, shard.dtype());
    model.groups().shard->all_gather(shard, full);
    auto values = full.to_vector<double>();
    values.resize(size_t(block.layout().numel()));
    out.push_back(values);
  }
  return out;
}

void train_two_steps(ShardedModel& model, ShardedAdamW& optimizer,
                     const std::vector<std::pair<std::string, Tensor>>& params, int rank) {
  for (int step = 0; step < 2; ++step) {
    model.gather_all();
    model.begin_backward();
    backward(weighted_sum(params, rank_weights(1700 + step, rank)));
    model.finish_backward();
    optimizer.step(1e-2);
    model.zero_gradients();
  }
}

TEST(MpiSharding, CheckpointsResumeOnADifferentNumberOfRanks) {
  for (ShardingStage stage : kStages) {
    // N ranks train and save; a world of one on every rank loads it.
    auto params = make_parameters(awkward_shapes(), 1600);
    ShardedModel model(group_parameters_by_layer(params), world_groups(), stage);
    ShardedAdamW optimizer(model, decay_groups(params, 0.1), {});
    train_two_steps(model, optimizer, params, world().rank());
    std::string many_to_one = shared_directory("ham_ckpt_n_to_1_");
    save_sharded_checkpoint(many_to_one, optimizer);
    auto saved_parameters = model.full_parameters();
    auto saved_exp_avg = full_moments(optimizer, false);
    auto saved_exp_avg_sq = full_moments(optimizer, true);

    auto single_params = make_parameters(awkward_shapes(), 1650);  // other values
    ShardedModel single(group_parameters_by_layer(single_params), single_process_groups(), stage);
    ShardedAdamW single_optimizer(single, decay_groups(single_params, 0.1), {});
    EXPECT_EQ(load_sharded_checkpoint(many_to_one, single_optimizer), 2);
    auto loaded = single.full_parameters();
    for (size_t i = 0; i < loaded.size(); ++i) {
      EXPECT_EQ(max_abs_difference(loaded[i].second, saved_parameters[i].second), 0)
          << loaded[i].first;
    }
    EXPECT_EQ(full_moments(single_optimizer, false), saved_exp_avg);
    EXPECT_EQ(full_moments(single_optimizer, true), saved_exp_avg_sq);

    // One process (rank 0's world of one) saves; N ranks load.
    std::string one_to_many = shared_directory("ham_ckpt_1_to_n_");
    if (world().rank() == 0) save_sharded_checkpoint(one_to_many, single_optimizer);
    world().barrier();
    auto fresh = make_parameters(awkward_shapes(), 1660);
    ShardedModel resumed(group_parameters_by_layer(fresh), world_groups(), stage);
    ShardedAdamW resumed_optimizer(resumed, decay_groups(fresh, 0.1), {});
    EXPECT_EQ(load_sharded_checkpoint(one_to_many, resumed_optimizer), 2);
    auto resumed_parameters = resumed.full_parameters();
    for (size_t i = 0; i < resumed_parameters.size(); ++i) {
      EXPECT_EQ(max_abs_difference(resumed_parameters[i].second, saved_parameters[i].second), 0);
    }
    EXPECT_EQ(full_moments(resumed_optimizer, true), saved_exp_avg_sq);
    // Both continue identically: one more step each.
    train_two_steps(resumed, resumed_optimizer, fresh, world().rank());
    train_two_steps(model, optimizer, params, world().rank());
    auto a = resumed.full_parameters(), b = model.full_parameters();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(max_abs_difference(a[i].second, b[i].second), 0);

    world().barrier();
    if (world().rank() == 0) {
      std::filesystem::remove_all(many_to_one);
      std::filesystem::remove_all(one_to_many);
    }
  }
}

TEST(HybridSharding, CheckpointOfTwoShardsLoadsOnOneProcess) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks (ctest: distributed.mpi_np4_hybrid)";
  auto params = make_parameters(awkward_shapes(), 1800);
  ShardedModel model(group_parameters_by_layer(params), pairs_of_ranks(), ShardingStage::Full);
  ShardedAdamW optimizer(model, decay_groups(params, 0.1), {});
  train_two_steps(model, optimizer, params, world().rank());
  std::string dir = shared_directory("ham_ckpt_hybrid_");
  save_sharded_checkpoint(dir, optimizer);  // replica 0 of each pair writes
  world().barrier();
  EXPECT_TRUE(std::filesystem::exists(dir + "/" + sharded_checkpoint_file_name(1, 2)));
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + sharded_checkpoint_file_name(0, 4)));
  auto saved = model.full_parameters();
  auto single_params = make_parameters(awkward_shapes(), 1850);
  ShardedModel single(group_parameters_by_layer(single_params), single_process_groups(),
                      ShardingStage::GradientsAndOptimizer);
  ShardedAdamW single_optimizer(single, decay_groups(single_params, 0.1), {});
  EXPECT_EQ(load_sharded_checkpoint(dir, single_optimizer), 2);
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(max_abs_difference(single_params[i].second, saved[i].second), 0) << saved[i].first;
  }
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ham::dist
