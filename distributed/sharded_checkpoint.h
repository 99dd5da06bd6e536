#pragma once
// Sharded optimizer checkpoints that load on any number of ranks.
//
// save writes <dir>/shard-<k>-of-<n>.safetensors for k = 0 .. n-1 (n = shard group size;
// under hybrid sharding only replica 0 of each shard writes: the replicas hold the same
// shards). File k holds, per block B, the unpadded part [begin, end) of shard k:
//   "B.master", "B.exp_avg", "B.exp_avg_sq"   ([end - begin], master dtype)
// with metadata "format" = "ham-sharded-v1", "num_shards", "steps_taken", and per block
// "B.layout" (every parameter's name and shape, so a different model is refused) and
// "B.begin". load reads only the files whose ranges overlap this rank's shard, copies the
// overlaps into its master shard and moments, and republishes the parameters: resuming
// n -> m ranks gives the state an m-rank run would have had.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "distributed/flat_shard.h"

namespace ham::dist {

// Collective (ends with a barrier, so every file exists when it returns on any rank).
void save_sharded_checkpoint(const std::string& dir, const ShardedAdamW& optimizer);
// Collective; returns the optimizer steps taken (also set on `optimizer`).
int64_t load_sharded_checkpoint(const std::string& dir, ShardedAdamW& optimizer);
// Conversions to and from nn's AdamW state ("exp_avg.<param>", "exp_avg_sq.<param>", full
// shapes), so a checkpoint of a one-process run resumes sharded and vice versa.
// Sets this rank's moment shards from a full AdamW state (every rank passes the same) and
// the step count. Not collective.
void load_full_optimizer_state(ShardedAdamW& optimizer,
                               const std::vector<std::pair<std::string, Tensor>>& adamw_state,
                               int64_t steps_taken);
// The whole AdamW state from the shards (CPU tensors). Collective over the shard group.
std::vector<std::pair<std::string, Tensor>> full_optimizer_state(const ShardedAdamW& optimizer);
// A sharded checkpoint read in one process without sharding the model: the AdamW state of
// the parameters named in `parameters` (their shapes and dtypes; values are not touched)
// and the step count.
std::pair<std::vector<std::pair<std::string, Tensor>>, int64_t> read_sharded_checkpoint_unsharded(
    const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& parameters);

// "shard-0003-of-0008.safetensors"
std::string sharded_checkpoint_file_name(int shard, int num_shards);

}  // namespace ham::dist
