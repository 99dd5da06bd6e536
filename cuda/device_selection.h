#pragma once
// Which GPU a process uses. The CUDA runtime already hides the GPUs that
// CUDA_VISIBLE_DEVICES leaves out (and renumbers the rest from 0); on top of that a
// process started by a launcher uses the GPU of its rank on the node, read from the
// first of these that is set: OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), MPI_LOCALRANKID
// (MPICH, Intel MPI), SLURM_LOCALID (srun). Pure C++ so it is tested on CPU.
#include <functional>
#include <optional>
#include <string>

namespace ham::cuda {

// Reads an environment variable; std::nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
EnvLookup process_environment();

struct LocalRank {
  int rank = 0;
  std::string source;  // the variable it came from; empty when none was set
};

// Throws naming the variable when its value is not a non-negative integer.
LocalRank local_rank_from_environment(const EnvLookup& env);

// The device index for this process: its local rank (0 without a launcher). Throws one
// line naming the rank, its variable, the visible device count and CUDA_VISIBLE_DEVICES
// when there are fewer devices than the rank needs.
int select_device_index(const EnvLookup& env, int visible_device_count);

}  // namespace ham::cuda
