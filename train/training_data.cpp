#include "train/training_data.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "core/file_io.h"
#include "train/shards.h"
#include "train/tokenizer.h"

namespace ham {

bool is_shard_spec(const std::string& path) {
  return path.find('*') != std::string::npos || path.find('?') != std::string::npos ||
         (path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0);
}

TrainingData open_training_data(const TrainOptions& options, const ModelConfig& config) {
  TrainingData data;
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options.tokenizer);
  if (is_shard_spec(options.data_path)) {
    int64_t doc_start = tokenizer->document_start_id();
    HAM_CHECK(config.vocab_size >= tokenizer->vocab_size(), "model config: key 'vocab_size' (",
              config.vocab_size, ") is smaller than the tokenizer's vocabulary (",
              tokenizer->vocab_size(), ", ", options.tokenizer, ")");
    data.train = std::make_unique<ShardDataset>(std::vector<std::string>{options.data_path},
                                                config.vocab_size, doc_start);
    if (!options.val_data_path.empty()) {
      data.val = std::make_unique<ShardDataset>(std::vector<std::string>{options.val_data_path},
                                                config.vocab_size, doc_start);
    } else {
      data.val = std::make_unique<TokenStream>(std::vector<int64_t>{}, doc_start);
    }
    data.description = options.data_path + " (token shards)";
    return data;
  }
  HAM_CHECK(options.val_data_path.empty(), "--val-data is for token shards; text data holds out "
            "its last 5% of documents");
  std::string source = options.data_path.empty() ? "<embedded corpus>" : options.data_path;
  std::string text = options.data_path.empty() ? std::string(default_corpus())
                                               : read_file(options.data_path, "the text file (--data)");
  // Text is encoded with the tokenizer: bytes by default.
  const bool bytes = options.tokenizer == "bytes";
  if (bytes) {
    HAM_CHECK(config.vocab_size >= ByteTokenizer::kVocabSize, source, " is byte-level text: the "
              "model config's key 'vocab_size' must be at least ", ByteTokenizer::kVocabSize,
              ", got ", config.vocab_size);
  } else {
    HAM_CHECK(config.vocab_size >= tokenizer->vocab_size(), source, ": model config: key 'vocab_size' (",
              config.vocab_size, ") is smaller than the tokenizer's vocabulary (", tokenizer->vocab_size(),
              ", ", options.tokenizer, ")");
  }
  auto [train_stream, val_stream] = TokenStream::from_text(text, 0.05, source, tokenizer.get());
  data.train = std::make_unique<TokenStream>(std::move(train_stream));
  data.val = std::make_unique<TokenStream>(std::move(val_stream));
  data.description = bytes ? source : source + " (" + tokenizer->name() + ")";
  return data;
}

double passes_over_data(const TrainOptions& options, int64_t data_tokens) {
  HAM_CHECK(data_tokens > 0, "passes_over_data: the data holds no tokens");
  const double data_share = std::max(0.0, 1.0 - options.mix_mqar - options.mix_niah);
  return double(options.steps) * double(options.batch_size * options.grad_accum) *
         double(options.seq_len) * data_share / double(data_tokens);
}

std::string data_use_summary(const TrainOptions& options, int64_t data_tokens) {
  if (data_tokens <= 0 || options.mix_mqar + options.mix_niah >= 1) {
    return fmt::format("{} train tokens, not read (every row synthetic)", data_tokens);
  }
  return fmt::format("{} train tokens, each read about {:.2g}x in {} steps", data_tokens,
                     passes_over_data(options, data_tokens), options.steps);
}

}  // namespace ham
