// The communicator in one process: the world of one (what plain `ham train` gets), the
// argument checks every backend shares, the watchdog and the abort path. The mpirun tests
// (tests/distributed/mpi/) cover MPI itself.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <map>

#include "autograd/engine.h"
#include "distributed/communicator.h"
#include "distributed/flat_shard.h"
#include "models/language_model.h"
#include "nn/optim.h"
#include "distributed/mpi_communicator.h"
#include "distributed/nccl_communicator.h"
#include "distributed/sharded_block_hooks.h"
#include "distributed/watchdog.h"
#include "tests/distributed/distributed_testing.h"
#include "tests/error_testing.h"

namespace ham::dist {
namespace {

using ham::testing::expect_error;
using testing::rank_tensor;

TEST(WorldOfOne, NeedsNoMpiWhenNotLaunchedByMpirun) {
  if (launched_by_mpi()) GTEST_SKIP() << "this process was started by an MPI launcher";
  auto world = make_world_communicator();
  EXPECT_EQ(world->rank(), 0);
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->local_rank(), 0);
  EXPECT_EQ(world->name(), "world");
}

// `ham train --device cuda` asks for NCCL; a world of one does not need it, so builds
// without NCCL train on one GPU.
TEST(WorldOfOne, IgnoresNcclUnlessAskedForInAWorldOfOne) {
  if (launched_by_mpi()) GTEST_SKIP() << "this process was started by an MPI launcher";
  WorldOptions options;
  options.use_nccl = true;
  auto world = make_world_communicator(options);
  EXPECT_EQ(world->size(), 1);
  EXPECT_NE(dynamic_cast<SingleProcessCommunicator*>(world.get()), nullptr);
  if (!built_with_nccl()) {
    options.nccl_in_a_world_of_one = true;
    expect_error([&] { make_world_communicator(options); }, {"NCCL", "no NCCL"});
  }
}

TEST(WorldOfOne, CollectivesAreTheIdentity) {
  SingleProcessCommunicator world;
  Tensor x = rank_tensor(1, 0, {3, 4}, DType::F32);
  Tensor before = x.clone();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max}) {
    world.all_reduce(x, op);
    EXPECT_EQ(x.to_vector<float>(), before.to_vector<float>()) << reduce_op_name(op);
  }
  Tensor scattered = Tensor::zeros({12});
  world.reduce_scatter(x, scattered, ReduceOp::Avg);
  EXPECT_EQ(scattered.to_vector<float>(), before.to_vector<float>());
  Tensor gathered = Tensor::zeros({2, 6});
  world.all_gather(x, gathered);
  EXPECT_EQ(gathered.to_vector<float>(), before.to_vector<float>());
  world.broadcast(x, 0);
  world.barrier();
  EXPECT_EQ(x.to_vector<float>(), before.to_vector<float>());
  EXPECT_DOUBLE_EQ(world.all_reduce_scalar(2.5, ReduceOp::Sum), 2.5);
  EXPECT_DOUBLE_EQ(mean_over_ranks(std::make_shared<SingleProcessCommunicator>())(-0.75), -0.75);
  auto sub = world.split(3, 0);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->name(), "world/split(3)");
}

TEST(CommunicatorChecks, BadArgumentsAreNamedOnOneLine) {
  SingleProcessCommunicator world;
  Tensor x = rank_tensor(2, 0, {4}, DType::F32);
  expect_error([&] { world.reduce_scatter(x, Tensor::zeros({3}), ReduceOp::Sum); },
               {"reduce_scatter", "world", "f32[4]", "f32[3]", "size (1)"});
  expect_error([&] { world.all_gather(x, Tensor::zeros({5})); },
               {"all_gather", "world", "f32[5]", "f32[4]"});
  expect_error([&] { world.all_gather(x, Tensor::zeros({4}, DType::F64)); },
               {"all_gather", "differ in dtype"});
  expect_error([&] { world.all_reduce(Tensor::zeros({2}, DType::I64), ReduceOp::Avg); },
               {"all_reduce", "avg needs a floating dtype", "i64[2]"});
  expect_error([&] { world.broadcast(x, 1); }, {"broadcast", "root 1", "size 1"});
  expect_error([&] { world.all_reduce(Tensor(), ReduceOp::Sum); }, {"all_reduce", "undefined"});
  expect_error([&] { world.split(-1, 0); }, {"split", "color", "-1"});
}

TEST(ShardingGroups, WorldOfOneAndBadSizes) {
  auto world = std::make_shared<SingleProcessCommunicator>();
  ShardingGroups groups = make_sharding_groups(world, 1);
  EXPECT_EQ(groups.shard->size(), 1);
  EXPECT_EQ(groups.replica->size(), 1);
  EXPECT_EQ(groups.shard_gradients->size(), 1);
  expect_error([&] { make_sharding_groups(world, 2); },
               {"sharding groups", "shard group size 2", "world size 1"});
}

TEST(CollectiveTimeout, ComesFromTheEnvironmentAndIsChecked) {
  EXPECT_DOUBLE_EQ(resolve_collective_timeout(7.5), 7.5);
  setenv("HAM_COLLECTIVE_TIMEOUT_S", "12", 1);
  EXPECT_DOUBLE_EQ(resolve_collective_timeout(0), 12.0);
  setenv("HAM_COLLECTIVE_TIMEOUT_S", "soon", 1);
  expect_error([] { resolve_collective_timeout(0); }, {"HAM_COLLECTIVE_TIMEOUT_S", "soon"});
  unsetenv("HAM_COLLECTIVE_TIMEOUT_S");
  EXPECT_DOUBLE_EQ(resolve_collective_timeout(0), 600.0);
}

// A collective blocked past the timeout ends the process naming the rank and the call.
TEST(CollectiveWatchdogDeathTest, EndsTheProcessWhenACollectiveHangs) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        CollectiveWatchdog watchdog(5, 0.2);
        CollectiveWatchdog::Scope armed(watchdog, "all_reduce(sum) of f32[8] on world");
        std::this_thread::sleep_for(std::chrono::seconds(20));
      },
      ::testing::ExitedWithCode(kWatchdogExitCode),
      "rank 5: all_reduce\\(sum\\) of f32\\[8\\] on world did not complete within 0.2 s");
}

TEST(CollectiveWatchdog, StaysQuietWhenCollectivesFinish) {
  CollectiveWatchdog watchdog(0, 0.05);
  for (int i = 0; i < 3; ++i) {
    CollectiveWatchdog::Scope armed(watchdog, "barrier on world");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // disarmed: nothing fires
  SUCCEED();
}

TEST(AbortJobDeathTest, AThrowingRankIsNamedAndTheJobEndsNonZero) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  SingleProcessCommunicator world;
  EXPECT_EXIT(run_or_abort_job(world, []() -> int { throw Error("loss is NaN at step 7"); }),
              ::testing::ExitedWithCode(1), "rank 0 failed: loss is NaN at step 7");
  EXPECT_EQ(run_or_abort_job(world, [] { return 4; }), 4);
}

TEST(Nccl, CollectivesOnCudaTensors) {
  // Compiled with CUDA and NCCL only; this project's CI machine has no GPU.
  std::string reason = nccl_unavailable_reason();
  if (!reason.empty()) GTEST_SKIP() << "NCCL not testable here: " << reason;
  SingleProcessCommunicator bootstrap;
  auto nccl = make_nccl_communicator(bootstrap, 0, 60);
  Tensor x = rank_tensor(3, 0, {5}, DType::F32).to(Device::cuda(0));
  Tensor before = x.to(Device::cpu());
  nccl->all_reduce(x, ReduceOp::Sum);
  EXPECT_EQ(x.to_vector<float>(), before.to_vector<float>());
  Tensor gathered = Tensor::zeros({5}, DType::F32, Device::cuda(0));
  nccl->all_gather(x, gathered);
  EXPECT_EQ(gathered.to_vector<float>(), before.to_vector<float>());
}

// The NCCL path of sharded training on one GPU: a world of one whose CUDA tensors go
// through a one-rank NCCL communicator, the tiny Transformer sharded with both stages, two
// steps against nn's AdamW on the same GPU (the same arithmetic: 1e-5 relative).
TEST(Nccl, ShardedTrainingStepOnOneGpuMatchesAdamW) {
  std::string reason = nccl_unavailable_reason();
  if (!reason.empty()) GTEST_SKIP() << "NCCL not testable here: " << reason;
  WorldOptions options;
  options.use_nccl = true;
  options.nccl_in_a_world_of_one = true;
  auto world = make_world_communicator(options);
  ModelConfig config =
      ModelConfig::from_file(std::string(HAM_SOURCE_DIR) + "/configs/tiny/transformer.json");
  const AdamW::Options adamw{3e-3, 0.9, 0.95, 1e-8};
  for (ShardingStage stage : {ShardingStage::GradientsAndOptimizer, ShardingStage::Full}) {
    auto reference = make_model(config), model = make_model(config);
    reference->to(Device::cuda());
    model->to(Device::cuda());
    AdamW reference_optimizer(decay_groups(reference->named_parameters(), 0.1), adamw);
    auto named = model->named_parameters();
    ShardedModel sharded(group_parameters_by_layer(named), make_sharding_groups(world, 1), stage);
    ShardedAdamW optimizer(sharded, decay_groups(named, 0.1), adamw);
    // Full gathers block by block from the model's layer loop, as the trainer does.
    if (stage == ShardingStage::Full) {
      model->set_block_hooks(std::make_shared<ShardedBlockHooks>(sharded, config.n_layers));
    }
    for (int step = 1; step <= 2; ++step) {
      std::vector<int64_t> tokens(2 * 33);
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int64_t((i * 37 + size_t(step)) % 257);
      std::vector<int64_t> in, out;
      for (int64_t r = 0; r < 2; ++r) {
        for (int64_t t = 0; t < 32; ++t) {
          in.push_back(tokens[size_t(r * 33 + t)]);
          out.push_back(tokens[size_t(r * 33 + t + 1)]);
        }
      }
      TokenBatch batch{Tensor::from_vector(in, {2, 32}).to(Device::cuda()),
                       Tensor::from_vector(out, {2, 32}).to(Device::cuda()), {}, {}};
      Tensor reference_loss = reference->loss(batch);
      backward(reference_loss);
      reference_optimizer.step(3e-3);
      reference_optimizer.zero_grad();
      Tensor loss = model->loss(batch);
      sharded.begin_backward();
      backward(loss);
      sharded.finish_backward();
      optimizer.step(3e-3);
      sharded.zero_gradients();
      EXPECT_NEAR(loss.item(), reference_loss.item(), 1e-5 * reference_loss.item())
          << sharding_stage_name(stage) << " step " << step;
    }
    auto full = sharded.full_parameters();
    std::map<std::string, Tensor> by_name(full.begin(), full.end());
    for (const auto& [name, p] : reference->named_parameters()) {
      EXPECT_LE(testing::max_abs_difference(by_name.at(name), p.to(Device::cpu())), 1e-5)
          << sharding_stage_name(stage) << " " << name;
    }
  }
}

TEST(Nccl, BuildsWithoutNcclSayWhy) {
  if (built_with_nccl()) GTEST_SKIP() << "this build has NCCL";
  SingleProcessCommunicator bootstrap;
  expect_error([&] { make_nccl_communicator(bootstrap, 0, 60); }, {"NCCL", "no NCCL"});
  EXPECT_NE(nccl_unavailable_reason().find("no NCCL"), std::string::npos);
}

}  // namespace
}  // namespace ham::dist
