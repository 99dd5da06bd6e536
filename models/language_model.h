#pragma once
// The interface every model family implements, so the trainer, eval and the CLI treat
// Transformer, GDN, GDN-GSA and HAM alike.
#include <memory>
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
  // Mean next-token cross-entropy over non-ignored targets (a 0-d tensor).
  Tensor loss(const TokenBatch& batch) const;
  const ModelConfig& config() const { return config_; }

 protected:
  ModelConfig config_;
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

 protected:
  explicit DecoderLM(const ModelConfig& config);
  template <class Block>
  std::shared_ptr<Block> add_layer(int64_t index, std::shared_ptr<Block> block) {
    return register_module("layers." + std::to_string(index), std::move(block));
  }
  void add_head();
  // Token embeddings of a [B, T] batch (the error names the model).
  Tensor embed_tokens(const TokenBatch& batch, const char* model) const;
  Tensor logits(const Tensor& x) const { return lm_head->forward(final_norm->forward(x)); }
  // One residual block x -> block(x, batch), rerun in backward instead of keeping its
  // activations when the config asks for recompute.
  template <class Block>
  Tensor run_block(const std::shared_ptr<Block>& block, const Tensor& x,
                   const TokenBatch& batch) const {
    if (!config_.recompute) return block->forward(x, batch);
    return checkpoint([block, batch](const std::vector<Tensor>& in) {
             return std::vector<Tensor>{block->forward(in[0], batch)};
           }, {x})[0];
  }

  Generator init_generator_;
};

std::shared_ptr<LanguageModel> make_model(const ModelConfig& config);

}  // namespace ham
