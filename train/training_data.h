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

// How many times a run is expected to read its training data: the tokens of its data rows
// (steps x batch x grad_accum x seq_len, times the share of rows not drawn from synthetic
// tasks; rows are windows at random offsets) over the data's `data_tokens`. Above 1 the
// model sees text again, and on a small corpus learns it by heart: its validation loss
// then rises while its training loss falls.
double passes_over_data(const TrainOptions& options, int64_t data_tokens);

// "N train tokens, each read about Px in S steps", for the logs.
std::string data_use_summary(const TrainOptions& options, int64_t data_tokens);

}  // namespace ham
