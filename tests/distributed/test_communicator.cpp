// The communicator in one process: the world of one (what plain `ham train` gets), the
// argument checks every backend shares, the watchdog and the abort path. The mpirun tests
// (tests/distributed/mpi/) cover MPI itself.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "distributed/communicator.h"
#include "distributed/mpi_communicator.h"
#include "distributed/nccl_communicator.h"
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

TEST(Nccl, BuildsWithoutNcclSayWhy) {
  if (built_with_nccl()) GTEST_SKIP() << "this build has NCCL";
  SingleProcessCommunicator bootstrap;
  expect_error([&] { make_nccl_communicator(bootstrap, 0, 60); }, {"NCCL", "no NCCL"});
  EXPECT_NE(nccl_unavailable_reason().find("no NCCL"), std::string::npos);
}

}  // namespace
}  // namespace ham::dist
