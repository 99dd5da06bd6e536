#pragma once
// The interface every model family implements, so the trainer, eval and the CLI treat
// Transformer, GDN, GDN-GSA and HAM alike.
#include <memory>
#include <vector>

#include "models/config.h"
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

std::shared_ptr<LanguageModel> make_model(const ModelConfig& config);

}  // namespace ham
