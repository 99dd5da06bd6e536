#pragma once
// Sharded data parallelism (ZeRO / FSDP style) over a shard group of N ranks.
//
// Each block's parameters (a layer's, or the embedding + final norm + head) are laid end
// to end in one flat buffer, padded with zeros to a multiple of N and split into N equal
// shards; rank r owns elements [r * S, (r + 1) * S), S = padded / N. Rank r keeps, for its
// shard only: master weights (f32, f64 for f64 models), the gradient shard and AdamW's
// two moments. Two stages:
//   GradientsAndOptimizer (ZeRO-2): parameters stay replicated; the model's tensors are
//     views of a persistent flat buffer and the master shard is a view of this rank's
//     chunk of it (f32 parameters), so after the optimizer step one in-place all-gather
//     republishes them.
//   Full (ZeRO-3 / FSDP): parameters exist only as shards. Before a block's forward (and
//     again before its backward) an all-gather fills a fresh flat buffer and the model's
//     tensors are re-pointed into it; release() drops it again. The model's block hooks
//     drive this block by block (distributed/sharded_block_hooks.h).
// Gradients: the block's gradients are copied into a flat buffer, reduce-scattered with
// avg over the shard group into a shard and accumulated into the gradient shard; under
// hybrid sharding the shard is then averaged over the replica group too, so every rank
// ends with its shard of the mean gradient over all ranks.
//
// Re-pointing works through the parameter's TensorImpl (which autograd's saved handles
// share), so a released parameter must not be read until it is gathered again (a Full
// model destroyed while released leaves its parameters at zero bytes: gather_all() first
// to keep using them). Build the model on its device before sharding it; Module::to()
// afterwards would undo the binding.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "distributed/communicator.h"
#include "nn/optim.h"

namespace ham::dist {

enum class ShardingStage : uint8_t { GradientsAndOptimizer, Full };
const char* sharding_stage_name(ShardingStage stage);  // "grads+optimizer", "full"
// Accepts "grads" / "grads+optimizer" / "zero2" and "full" / "zero3"; the error lists them.
ShardingStage parse_sharding_stage(const std::string& text);

// ---- Layout ---------------------------------------------------------------------------

// One parameter's place in a flat buffer.
struct FlatEntry {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;
};

// The part of one parameter that lies in one shard.
struct ShardSegment {
  size_t entry = 0;             // index into FlatLayout::entries()
  int64_t offset_in_param = 0;  // first element of the piece within the parameter
  int64_t offset_in_shard = 0;  // ... and within the shard
  int64_t numel = 0;
};

class FlatLayout {
 public:
  FlatLayout(const std::vector<std::pair<std::string, Shape>>& parameters, int num_shards);
  const std::vector<FlatEntry>& entries() const { return entries_; }
  int num_shards() const { return num_shards_; }
  int64_t numel() const { return numel_; }                // sum of the parameters' sizes
  int64_t padded_numel() const { return shard_numel_ * num_shards_; }
  int64_t shard_numel() const { return shard_numel_; }    // ceil(numel / num_shards)
  int64_t shard_begin(int shard) const { return int64_t(shard) * shard_numel_; }
  // Pieces of parameters in shard `shard`, in flat order (padding is in none of them).
  std::vector<ShardSegment> segments(int shard) const;

 private:
  std::vector<FlatEntry> entries_;
  int num_shards_ = 1;
  int64_t numel_ = 0, shard_numel_ = 0;
};

// A block's named parameters.
struct ParameterBlock {
  std::string name;
  std::vector<std::pair<std::string, Tensor>> parameters;
};
// Block 0 is "rest": every parameter outside the layers (embed, final_norm, lm_head), in
// registration order (left out when there is none). Then one block per "layers.<i>."
// prefix, named "layers.<i>", in layer order. Backward finishes the blocks in reverse
// index order (the last layer first, the embedding last), which ShardedModel relies on.
// A group holding several dtypes (a bf16 model whose gates and routers stay f32) is split
// into adjacent blocks "<name>" and "<name>:<dtype>" (e.g. "layers.0:f32"), one flat
// buffer per dtype.
std::vector<ParameterBlock> group_parameters_by_layer(
    const std::vector<std::pair<std::string, Tensor>>& named_parameters);

// ---- One block ------------------------------------------------------------------------

// Bytes of gathered parameter buffers (Full) alive on this rank, counted from the start of
// each all-gather (its buffer exists from then) to the release, and the most ever alive.
struct GatheredParameterBytes {
  int64_t now = 0, peak = 0;
  void add(int64_t bytes) {
    now += bytes;
    if (now > peak) peak = now;
  }
  void remove(int64_t bytes) { now -= bytes; }
};

class ShardedBlock {
 public:
  // Collective over the groups. Every rank must pass identical parameter values (checked:
  // a sum and a sum of squares per block agree across ranks).
  ShardedBlock(ParameterBlock block, ShardingGroups groups, ShardingStage stage);
  ~ShardedBlock();
  ShardedBlock(const ShardedBlock&) = delete;
  ShardedBlock& operator=(const ShardedBlock&) = delete;

  const std::string& name() const { return name_; }
  const FlatLayout& layout() const { return layout_; }
  const std::vector<std::pair<std::string, Tensor>>& parameters() const { return parameters_; }
  ShardingStage stage() const { return stage_; }
  DType parameter_dtype() const { return parameter_dtype_; }
  DType master_dtype() const { return master_dtype_; }
  Device device() const { return device_; }
  int shard_index() const;  // this rank's shard: its rank in the shard group

  // Parameters (no-ops in GradientsAndOptimizer, where they are always there).
  void start_gather();  // starts the all-gather unless gathered or already started
  void wait_gather();   // starts it if needed; the model's tensors hold the values after
  bool gathered() const;
  void release();  // Full: the model's tensors lose their storage until the next gather
  // Full: counts this block's gathered buffers in `counter` from now on.
  void count_gathered_bytes_in(std::shared_ptr<GatheredParameterBytes> counter) {
    gathered_bytes_ = std::move(counter);
  }

  // Gradients. start: copies each parameter's grad() (zeros where undefined) into a flat
  // buffer, clears grad() and starts the reduce-scatter. wait: accumulates the shard
  // into gradient_shard() (and averages over the replica group first).
  void start_gradient_reduce_scatter();
  void wait_gradient_reduce_scatter();
  bool gradient_reduce_scatter_started() const { return pending_scatter_ != nullptr; }
  // For hook-driven flattening: this block's flat gradient buffer (allocated, zeroed, on
  // first use) and the reduce-scatter of it.
  Tensor flat_gradient_buffer();
  void write_flat_gradient(size_t entry, const Tensor& gradient);  // entry: layout index
  void start_reduce_scatter_of_flat_gradients();

  // The shard the optimizer updates ([shard_numel], master dtype) and its gradient.
  const Tensor& master_shard() const { return master_shard_; }
  const Tensor& gradient_shard() const { return gradient_shard_; }
  void zero_gradient_shard();
  // After the optimizer changed master_shard(): GradientsAndOptimizer all-gathers the new
  // values into the parameters; Full releases a gathered buffer (the next gather reads
  // the new shard).
  void publish_parameters();

  // Full copies of the parameters (fresh CPU tensors, in the parameter dtype). Collective
  // over the shard group.
  std::vector<std::pair<std::string, Tensor>> full_parameters();
  // The same from the master shards (f32 for f32 and bf16 models, f64 for f64): the values
  // a bf16 model's parameters are rounded from. Collective over the shard group.
  std::vector<std::pair<std::string, Tensor>> full_master_parameters();
  // Sets this rank's master shard from full values (every rank passes the same; names
  // looked up in `full`, missing ones are an error). Call publish_parameters() after.
  void load_full_parameters(const std::map<std::string, Tensor>& full);

  // Bytes this block keeps on this rank between steps.
  int64_t replicated_parameter_bytes() const;  // GradientsAndOptimizer's flat buffer
  int64_t gathered_parameter_bytes() const;    // Full: while gathered
  int64_t master_bytes() const;                // 0 when it is a view of the flat buffer
  int64_t gradient_shard_bytes() const;

 private:
  void bind_parameters_to(const Tensor& flat);
  void check_replicas_agree(const Tensor& flat);
  Tensor gather_input() const;

  std::string name_;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  ShardingGroups groups_;
  ShardingStage stage_;
  FlatLayout layout_;
  DType parameter_dtype_ = DType::F32, master_dtype_ = DType::F32;
  Device device_;
  bool master_is_view_ = false;
  Tensor flat_parameters_;  // padded, parameter dtype; undefined while released (Full)
  Tensor master_shard_, gradient_shard_;
  std::unique_ptr<PendingCollective> pending_gather_;
  Tensor gathering_into_;  // Full: the buffer an unfinished gather writes
  Tensor flat_gradients_;  // while gradients are being flattened / scattered
  Tensor scattered_shard_;
  std::unique_ptr<PendingCollective> pending_scatter_;
  std::shared_ptr<Storage> released_storage_;  // zero bytes: what released tensors point at
  std::shared_ptr<GatheredParameterBytes> gathered_bytes_;  // null: not counted
};

// ---- A model --------------------------------------------------------------------------

// Memory one rank keeps for the sharded model (bytes).
struct ShardMemoryReport {
  int64_t parameters = 0;  // replicated (ZeRO-2) or peak gathered: rest + 2 adjacent layers
  int64_t master = 0;
  int64_t gradients = 0;   // gradient shards
  int64_t optimizer = 0;   // AdamW moments
  int64_t total() const { return parameters + master + gradients + optimizer; }
  // "parameters 1.250 MiB, master 0.000 MiB, gradients ..., optimizer ..., total ..."
  std::string str() const;
};

class ShardedModel {
 public:
  // Blocks as group_parameters_by_layer gives them (any grouping works). Collective.
  ShardedModel(std::vector<ParameterBlock> blocks, ShardingGroups groups, ShardingStage stage);
  ~ShardedModel();

  size_t num_blocks() const { return blocks_.size(); }
  ShardedBlock& block(size_t index) { return *blocks_.at(index); }
  const ShardedBlock& block(size_t index) const { return *blocks_.at(index); }
  size_t block_index(const std::string& name) const;  // throws naming the block
  const ShardingGroups& groups() const { return groups_; }
  ShardingStage stage() const { return stage_; }

  // Parameters of one block (see ShardedBlock).
  void prefetch(size_t index) { block(index).start_gather(); }
  void gather(size_t index) { block(index).wait_gather(); }
  void release(size_t index) { block(index).release(); }
  void gather_all();
  void release_all();
  // Makes the block's gradients arrive right after its backward in the next backward
  // instead of at the end of it (call just before the block's forward, in grad mode): the
  // engine runs ready nodes in decreasing creation order and a parameter's AccumulateGrad
  // is made once, at its first use, so it would otherwise run after every newer node.
  // Renumbered as if made now, the block's leaf hooks fire (its reduce-scatter starts,
  // Full releases it) while the blocks before it still run their backward.
  void accumulate_gradients_right_after_backward_of(size_t index);

  // Full: gathered parameter bytes now and the most at once since construction or the last
  // reset (GradientsAndOptimizer: the replicated buffers, always there).
  int64_t gathered_parameter_bytes_now() const;
  int64_t peak_gathered_parameter_bytes() const;
  void reset_peak_gathered_parameter_bytes();
  // Bytes of all parameters unsharded (no padding): what one process holds.
  int64_t full_parameter_bytes() const;

  // Backward. While armed, each parameter's gradient is copied into its block's flat
  // buffer as it arrives; once every parameter of a block has its gradient, the block's
  // reduce-scatter starts (and, under Full, the block is released: every node reading its
  // parameters has run by then). finish_backward starts the blocks still incomplete
  // (unused parameters count as zero gradients), waits for all and disarms. Call the pair
  // around each backward (each micro-batch; shards accumulate until zero_gradients()).
  void begin_backward();
  void finish_backward();
  // Without the hooks: every block's grad() -> reduce-scatter -> shards (waits).
  void reduce_scatter_gradients();
  void zero_gradients();  // zeroes every gradient shard

  // sqrt(sum of squares of the whole gradient), from the shards: each rank's squared
  // norm, summed over the shard group.
  double gradient_norm();
  // Scales the gradient shards so the global norm is at most max_norm; returns the norm
  // before (NaN/Inf: nothing scaled), like nn's clip_grad_norm.
  double clip_gradient_norm(double max_norm);
  // The first parameter (model order) with a non-finite gradient on any rank, or "".
  std::string first_non_finite_gradient();

  // Every block's master shard -> parameters (after an optimizer step).
  void publish_parameters();
  // Full parameter copies, for model.safetensors. Collective over the shard group.
  std::vector<std::pair<std::string, Tensor>> full_parameters();
  // Full copies of the master weights (f32 for bf16 models): what checkpoints save, so a
  // resumed bf16 run continues from the exact f32 values. Collective over the shard group.
  std::vector<std::pair<std::string, Tensor>> full_master_parameters();
  // The whole mean gradient (what one process would hold in grad() before clipping), as
  // fresh tensors in the parameters' dtype and device, model order by block. Collective over
  // the shard group; costs a full copy of the gradients (for gradient inspection only).
  std::vector<std::pair<std::string, Tensor>> full_gradients();
  // The inverse (an unsharded checkpoint, any number of ranks): sets every master shard,
  // then publishes. Collective.
  void load_full_parameters(const std::vector<std::pair<std::string, Tensor>>& named);

  ShardMemoryReport memory_per_rank(bool with_optimizer = true) const;

 private:
  struct GradientTracking;
  std::vector<std::unique_ptr<ShardedBlock>> blocks_;
  ShardingGroups groups_;
  ShardingStage stage_;
  std::shared_ptr<GradientTracking> tracking_;
  std::shared_ptr<GatheredParameterBytes> gathered_bytes_;
};

// ---- Optimizer ------------------------------------------------------------------------

// AdamW over the local shards, element for element the update nn's AdamW makes on the full
// parameters (the same adamw_step kernel on each parameter's piece of the shard, with its
// group's weight decay and lr scale).
class ShardedAdamW {
 public:
  // Every parameter of the model must be in exactly one group (checked by name).
  ShardedAdamW(ShardedModel& model, const std::vector<ParamGroup>& groups,
               AdamW::Options options);

  // One update of every shard at learning rate `lr`, then model.publish_parameters().
  void step(double lr);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }

  // The moments of block `index` ([shard_numel], master dtype).
  const Tensor& exp_avg(size_t index) const { return exp_avg_.at(index); }
  const Tensor& exp_avg_sq(size_t index) const { return exp_avg_sq_.at(index); }
  ShardedModel& model() const { return model_; }

 private:
  struct SegmentHyper {
    ShardSegment segment;
    double weight_decay = 0, lr_scale = 1;
  };
  ShardedModel& model_;
  AdamW::Options options_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  std::vector<std::vector<SegmentHyper>> segments_;  // [block][piece]
  int64_t step_ = 0;
};

}  // namespace ham::dist
