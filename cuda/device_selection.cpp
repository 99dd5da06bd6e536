#include "cuda/device_selection.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ham::cuda {

EnvLookup process_environment() {
  return [](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

LocalRank local_rank_from_environment(const EnvLookup& env) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    std::optional<std::string> value = env(name);
    if (!value) continue;
    size_t used = 0;
    int rank = -1;
    try {
      rank = std::stoi(*value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    HAM_CHECK(used == value->size() && used > 0 && rank >= 0, "device selection: ", name, "='",
              *value, "' is not a local rank (a non-negative integer)");
    return {rank, name};
  }
  return {0, ""};
}

int select_device_index(const EnvLookup& env, int visible_device_count) {
  LocalRank local = local_rank_from_environment(env);
  std::optional<std::string> visible = env("CUDA_VISIBLE_DEVICES");
  std::string visible_text = visible ? "CUDA_VISIBLE_DEVICES='" + *visible + "'"
                                     : std::string("CUDA_VISIBLE_DEVICES unset");
  if (visible_device_count <= 0) {
    HAM_FAIL("device selection: no CUDA device is visible (", visible_text, ")");
  }
  if (local.rank >= visible_device_count) {
    HAM_FAIL("device selection: local rank ", local.rank, " (from ", local.source,
             ") needs GPU ", local.rank, " but only ", visible_device_count,
             " device(s) are visible (", visible_text, "); start at most ", visible_device_count,
             " ranks per node");
  }
  return local.rank;
}

}  // namespace ham::cuda
