// The memory a single process keeps for the tiny transformer under each stage (N = 1; the
// mpirun tests print N = 2 and N = 4).
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "distributed/flat_shard.h"
#include "models/language_model.h"
#include "tests/distributed/distributed_testing.h"

namespace ham::dist {
namespace {

TEST(MemoryReport, OneRankHoldsTheWholeModelOnce) {
  ModelConfig config =
      ModelConfig::from_file(std::string(HAM_SOURCE_DIR) + "/configs/tiny/transformer.json");
  config.n_layers = 8;  // enough layers for full sharding's gather-as-you-go to show
  for (ShardingStage stage : {ShardingStage::GradientsAndOptimizer, ShardingStage::Full}) {
    auto model = make_model(config);
    const int64_t bytes = model->num_parameters() * 4;
    ShardedModel sharded(group_parameters_by_layer(model->named_parameters()),
                         testing::single_process_groups(), stage);
    ShardMemoryReport report = sharded.memory_per_rank();
    EXPECT_EQ(report.gradients, bytes);
    EXPECT_EQ(report.optimizer, 2 * bytes);
    // ZeRO-2 keeps the parameters once (the master is a view of them); full sharding keeps
    // an f32 master and gathers at most the rest block plus two of the eight layers.
    if (stage == ShardingStage::Full) {
      EXPECT_EQ(report.master, bytes);
      EXPECT_LT(report.parameters, bytes / 2);
    } else {
      EXPECT_EQ(report.parameters, bytes);
      EXPECT_EQ(report.master, 0);
    }
    std::printf("memory per rank, tiny transformer with 8 layers, N=1, %s: %s\n", sharding_stage_name(stage),
                report.str().c_str());
  }
}

}  // namespace
}  // namespace ham::dist
