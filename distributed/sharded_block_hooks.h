#pragma once
// Per-block parameter gathering for Full sharding, driven by a model's block hooks
// (models/language_model.h). Header-only: ham_distributed does not depend on ham_models;
// whoever installs these hooks (the trainer, tests) links both.
//
//   forward:  outer (embedding): gather "rest", prefetch layer 0
//             layer i: gather i, prefetch i + 1; after its forward release i
//             outer (head): "rest" is still there
//   backward: outer (head): prefetch layer n - 1
//             layer i: gather i again, prefetch i - 1; after its backward release i
//             (its gradients arrive right after its backward: the leaf hooks start its
//             reduce-scatter and release it; after_backward releases a block whose
//             gradients are incomplete, e.g. an unused parameter's)
//             outer (embedding): "rest" is still there
// "rest" stays gathered from the embedding's forward to the end of backward (the head
// runs last in forward and first in backward; finish_backward or the optimizer step
// releases it), so the peak is "rest" + the running layer + the prefetched one. Prefetches
// are asynchronous all-gathers; the wait happens in the block's own before_* hook. The
// prefetch choice never affects correctness: every before_* waits for its own block.
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "distributed/flat_shard.h"
#include "models/language_model.h"

namespace ham::dist {

class ShardedBlockHooks final : public BlockHooks {
 public:
  // `sharded` must be Full and grouped by group_parameters_by_layer of a model with
  // `n_layers` layers (blocks "rest", "layers.0" ... "layers.<n-1>", each possibly with
  // ":<dtype>" parts; checked).
  ShardedBlockHooks(ShardedModel& sharded, int64_t n_layers) : sharded_(sharded) {
    HAM_CHECK(sharded.stage() == ShardingStage::Full,
              "sharded block hooks: the model is sharded with stage '",
              sharding_stage_name(sharded.stage()), "'; per-block gathering needs 'full'");
    rest_ = blocks_named("rest");
    size_t found = rest_.size();
    for (int64_t i = 0; i < n_layers; ++i) {
      layers_.push_back(blocks_named("layers." + std::to_string(i)));
      found += layers_.back().size();
    }
    HAM_CHECK(sharded.num_blocks() == found, "sharded block hooks: the sharded model has ",
              sharded.num_blocks(), " blocks, the model ", n_layers, " layers + \"rest\"");
  }

  void before_forward(int64_t block) override {
    if (block == kOuterBlock) {
      const bool embedding = last_forward_block_ < 0;  // else the head, after the layers
      last_forward_block_ = kOuterBlock;
      for (size_t b : rest_) sharded_.gather(b);
      if (embedding && !layers_.empty()) prefetch(layers_.front());
      return;
    }
    last_forward_block_ = block;
    for (size_t b : layer(block)) sharded_.gather(b);
    if (size_t(block) + 1 < layers_.size()) prefetch(layers_[size_t(block) + 1]);
    if (GradMode::is_enabled()) {
      for (size_t b : layer(block)) sharded_.accumulate_gradients_right_after_backward_of(b);
    }
  }

  void after_forward(int64_t block) override {
    if (block == kOuterBlock) return;
    for (size_t b : layer(block)) sharded_.release(b);
  }

  void before_backward(int64_t block) override {
    if (block == kOuterBlock) {
      const bool head = last_backward_block_ < 0;  // else the embedding, after the layers
      last_backward_block_ = kOuterBlock;
      for (size_t b : rest_) sharded_.gather(b);
      if (head && !layers_.empty()) prefetch(layers_.back());
      return;
    }
    last_backward_block_ = block;
    for (size_t b : layer(block)) sharded_.gather(b);
    if (block > 0) prefetch(layers_[size_t(block) - 1]);
  }

  void after_backward(int64_t block) override {
    if (block == kOuterBlock) return;
    for (size_t b : layer(block)) sharded_.release(b);
  }

 private:
  // The sharded blocks of group `name`: "<name>" and its "<name>:<dtype>" parts.
  std::vector<size_t> blocks_named(const std::string& name) const {
    std::vector<size_t> out{sharded_.block_index(name)};
    for (size_t b = 0; b < sharded_.num_blocks(); ++b) {
      if (sharded_.block(b).name().rfind(name + ":", 0) == 0) out.push_back(b);
    }
    return out;
  }
  void prefetch(const std::vector<size_t>& blocks) {
    for (size_t b : blocks) sharded_.prefetch(b);
  }
  const std::vector<size_t>& layer(int64_t block) const {
    HAM_CHECK(block >= 0 && size_t(block) < layers_.size(), "sharded block hooks: block ", block,
              " is not a layer of this ", layers_.size(), "-layer model");
    return layers_[size_t(block)];
  }

  ShardedModel& sharded_;
  std::vector<size_t> rest_;                 // sharded blocks of "rest"
  std::vector<std::vector<size_t>> layers_;  // sharded blocks of layer i
  int64_t last_forward_block_ = kOuterBlock, last_backward_block_ = kOuterBlock;
};

}  // namespace ham::dist
