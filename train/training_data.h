#pragma once
// Opening the data `ham train` trains on and `ham eval` measures perplexity on: byte-level
// text (the embedded corpus or a file) or llm.c token shards.
#include <memory>
#include <string>

#include "models/config.h"
#include "train/text_data.h"
#include "train/trainer.h"

namespace ham {

// True for llm.c token shards: a path ending in ".bin" or a glob ('*' or '?').
bool is_shard_spec(const std::string& path);

struct TrainingData {
  std::unique_ptr<TokenSource> train, val;
  std::string description;
};

// Byte-level text (options.data_path, or the embedded corpus when it is empty; the last 5%
// of documents held out as `val`), or llm.c token shards (`val` from options.val_data_path,
// empty when that is unset), checked against the model's vocabulary. Reads data_path,
// val_data_path and tokenizer from `options`.
TrainingData open_training_data(const TrainOptions& options, const ModelConfig& config);

}  // namespace ham
