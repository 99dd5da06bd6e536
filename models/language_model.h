#pragma once
// The interface every model family implements, so the trainer, eval and the CLI treat
// Transformer, GDN, GDN-GSA and HAM alike.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "core/random.h"
#include "models/config.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace ham {

// A packed batch: token ids [B, T] and, optionally, document ids [B, T] (tokens attend
// and recur only within their own document) and positions [B, T] that restart at 0 at
// each document start.
struct TokenBatch {
  Tensor inputs;     // [B, T] i64
  Tensor targets;    // [B, T] i64; ignore_index where no loss is wanted
  Tensor doc_ids;    // optional [B, T] i64
  Tensor positions;  // optional [B, T] i64
};

// How one HAM layer routed tokens in the last forward pass.
struct LayerRouting {
  int64_t layer = 0;
  double kv_fraction = 0;  // selected tokens / tokens
  double tau = 0;          // threshold in score units
};

// Told where the forward and the backward pass are, block by block, so that a caller can
// hold a block's parameters only while they are read (sharded data parallelism gathers
// them). Blocks are the layers 0 .. n-1 and kOuterBlock: the embedding (first in forward,
// last in backward) and the final norm + head (last in forward, first in backward). Order:
//   forward:  outer, 0, 1, ..., n-1, outer   (before_forward(b) ... after_forward(b) each)
//   backward: outer, n-1, ..., 0, outer      (before_backward(b) ... after_backward(b) each;
//             the embedding's backward has no differentiable input, so its visit gets
//             before_backward only: the caller's code after backward() is its end)
// The backward calls come from identity nodes on each block's inputs and outputs: the
// engine runs nodes in decreasing creation order, so before_backward(b) runs before any
// node of the block's backward (an activation recompute included) and after_backward(b)
// after all of them. Models without hooks (the default) build exactly the graph they
// always did.
struct BlockHooks {
  static constexpr int64_t kOuterBlock = -1;
  virtual ~BlockHooks() = default;
  virtual void before_forward(int64_t block) {}
  virtual void after_forward(int64_t block) {}
  virtual void before_backward(int64_t block) {}
  virtual void after_backward(int64_t block) {}
};

class LanguageModel : public Module {
 public:
  explicit LanguageModel(ModelConfig config) : config_(std::move(config)) {}
  // Logits [B, T, vocab].
  virtual Tensor forward(const TokenBatch& batch) const = 0;
  // Per-layer routing of the last forward pass (empty for families without routing).
  virtual std::vector<LayerRouting> routing() const { return {}; }
  // Called by the trainer after each optimizer step (learned thresholds update here,
  // Algorithm 2). `step` counts completed steps from 1.
  virtual void after_optimizer_step(int64_t step) {}
  // Training state that is not a parameter (HAM's learned thresholds and their own
  // optimizer), saved in checkpoints so that a resumed run continues bit for bit.
  virtual std::vector<std::pair<std::string, Tensor>> training_state() const { return {}; }
  virtual void load_training_state(const std::vector<std::pair<std::string, Tensor>>& state) {}
  // Mean next-token cross-entropy over non-ignored targets (a 0-d tensor; f32 for bf16
  // models). The default is cross_entropy(forward(batch)); DecoderLM fuses the head.
  virtual Tensor loss(const TokenBatch& batch) const;
  const ModelConfig& config() const { return config_; }
  // Installs hooks called around each block (null removes them). Every family calls them.
  void set_block_hooks(std::shared_ptr<BlockHooks> hooks) { block_hooks_ = std::move(hooks); }
  const std::shared_ptr<BlockHooks>& block_hooks() const { return block_hooks_; }

 protected:
  ModelConfig config_;
  std::shared_ptr<BlockHooks> block_hooks_;
};

// The shape every family shares: embedding -> layers -> final RMSNorm -> untied lm_head,
// named embed, layers.<i>, final_norm, lm_head. A family's constructor adds its layers
// with add_layer() and then calls add_head(), so every parameter is drawn, in that
// order, from one Philox generator seeded by config.seed.
class DecoderLM : public LanguageModel {
 public:
  std::shared_ptr<Embedding> embed;
  std::shared_ptr<RMSNorm> final_norm;
  std::shared_ptr<Linear> lm_head;

  // The last layer's output [B, T, d_model], before the final norm: what each family
  // computes.
  virtual Tensor hidden_states(const TokenBatch& batch) const = 0;
  // Logits [B, T, vocab] = lm_head(final_norm(hidden_states)).
  Tensor forward(const TokenBatch& batch) const override;
  // The same loss through the fused linear cross-entropy (nn/linear_cross_entropy.h): the
  // head's logits exist only a chunk of rows at a time, never as [B, T, vocab].
  Tensor loss(const TokenBatch& batch) const override;

 protected:
  explicit DecoderLM(const ModelConfig& config);
  template <class Block>
  std::shared_ptr<Block> add_layer(int64_t index, std::shared_ptr<Block> block) {
    return register_module("layers." + std::to_string(index), std::move(block));
  }
  void add_head();
  // Token embeddings of a [B, T] batch (the error names the model); the outer block's
  // first visit.
  Tensor embed_tokens(const TokenBatch& batch, const char* model) const;
  // One residual block x -> block(x, batch) at layer `index`, rerun in backward instead of
  // keeping its activations when the config asks for recompute (inside the block's hooks,
  // so the rerun finds its parameters where before_backward put them).
  template <class Block>
  Tensor run_block(int64_t index, const std::shared_ptr<Block>& block, const Tensor& x,
                   const TokenBatch& batch) const {
    Tensor in = enter_block(index, {x})[0];
    Tensor out = config_.recompute
                     ? checkpoint([block, batch](const std::vector<Tensor>& inputs) {
                         return std::vector<Tensor>{block->forward(inputs[0], batch)};
                       }, {in})[0]
                     : block->forward(in, batch);
    return leave_block(index, {out})[0];
  }
  // Block boundaries, no-ops (the tensors returned as given) without hooks. enter_block
  // puts an identity node on the block's inputs (backward: after_backward(block)), then
  // calls before_forward(block); leave_block puts one on its outputs (backward:
  // before_backward(block)), then calls after_forward(block). Undefined tensors pass.
  std::vector<Tensor> enter_block(int64_t block, const std::vector<Tensor>& inputs) const;
  std::vector<Tensor> leave_block(int64_t block, const std::vector<Tensor>& outputs) const;

  Generator init_generator_;
};

std::shared_ptr<LanguageModel> make_model(const ModelConfig& config);

}  // namespace ham
