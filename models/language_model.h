#pragma once
// The interface every model family implements, so the trainer, eval and the CLI treat
// Transformer, GDN, GDN-GSA and HAM alike.
#include <memory>

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

class LanguageModel : public Module {
 public:
  explicit LanguageModel(ModelConfig config) : config_(std::move(config)) {}
  // Logits [B, T, vocab].
  virtual Tensor forward(const TokenBatch& batch) const = 0;
  // Mean next-token cross-entropy over non-ignored targets (a 0-d tensor).
  Tensor loss(const TokenBatch& batch) const;
  const ModelConfig& config() const { return config_; }

 protected:
  ModelConfig config_;
};

std::shared_ptr<LanguageModel> make_model(const ModelConfig& config);

}  // namespace ham
