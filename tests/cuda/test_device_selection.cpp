// Which GPU a process picks: its local rank from the launcher's environment (CPU test).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "cuda/device_selection.h"
#include "tests/error_testing.h"

namespace ham::cuda {
namespace {

EnvLookup fake_env(std::map<std::string, std::string> values) {
  return [values](const char* name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

TEST(CudaDeviceSelection, WithoutALauncherTheFirstVisibleDeviceIsUsed) {
  EXPECT_EQ(select_device_index(fake_env({}), 1), 0);
  EXPECT_EQ(local_rank_from_environment(fake_env({})).source, "");
}

TEST(CudaDeviceSelection, LocalRankPicksTheDevice) {
  EXPECT_EQ(select_device_index(fake_env({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}}), 4), 3);
  EXPECT_EQ(select_device_index(fake_env({{"MPI_LOCALRANKID", "1"}}), 2), 1);
  EXPECT_EQ(select_device_index(fake_env({{"SLURM_LOCALID", "2"}}), 8), 2);
}

TEST(CudaDeviceSelection, OpenMpiRankWinsOverSlurm) {
  LocalRank local = local_rank_from_environment(
      fake_env({{"SLURM_LOCALID", "0"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  EXPECT_EQ(local.rank, 1);
  EXPECT_EQ(local.source, "OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST(CudaDeviceSelection, TooFewDevicesNamesRankCountAndVisibleDevices) {
  testing::expect_error(
      [] {
        select_device_index(
            fake_env({{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"CUDA_VISIBLE_DEVICES", "0,1"}}), 2);
      },
      {"local rank 2", "OMPI_COMM_WORLD_LOCAL_RANK", "only 2 device(s)",
       "CUDA_VISIBLE_DEVICES='0,1'"});
  testing::expect_error([] { select_device_index(fake_env({}), 0); },
                        {"no CUDA device", "CUDA_VISIBLE_DEVICES unset"});
}

TEST(CudaDeviceSelection, MalformedRankIsNamed) {
  testing::expect_error([] { local_rank_from_environment(fake_env({{"SLURM_LOCALID", "x1"}})); },
                        {"SLURM_LOCALID='x1'", "not a local rank"});
  testing::expect_error([] { local_rank_from_environment(fake_env({{"MPI_LOCALRANKID", "-1"}})); },
                        {"MPI_LOCALRANKID='-1'"});
}

}  // namespace
}  // namespace ham::cuda
