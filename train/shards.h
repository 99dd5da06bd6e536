#pragma once
// llm.c token shards: a header of 256 int32 [magic, version, token count, 0, ...] followed
// by the tokens, uint16 (magic 20240520, version 1) or uint32 (magic 20240801, version 7),
// little-endian. A file holds exactly 1024 + count * width bytes. Every document starts
// with the document-start token (GPT-2's <|endoftext|>); a document may continue from one
// shard into the next, so a list of shards reads as one stream.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/random.h"
#include "models/language_model.h"
#include "train/text_data.h"

namespace ham {

class Tokenizer;

constexpr int32_t kShardMagicUint16 = 20240520;
constexpr int32_t kShardVersionUint16 = 1;
constexpr int32_t kShardMagicUint32 = 20240801;
constexpr int32_t kShardVersionUint32 = 7;
constexpr int64_t kShardHeaderBytes = 256 * 4;

// Bytes per token for a vocabulary: 2 when every id fits in uint16, else 4.
int shard_token_width(int64_t vocab_size);

// Writes one shard; token_width is 2 or 4 and every token must fit in it.
void write_shard(const std::string& path, const std::vector<int64_t>& tokens, int token_width);

// A validated, memory-mapped shard (read-only; copies share the mapping).
class Shard {
 public:
  // Checks the magic, the version for that magic and the file size; with vocab_size > 0
  // also that every token is below it. Errors are one line naming the file.
  static Shard open(const std::string& path, int64_t vocab_size = 0);

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // tokens
  int token_width() const { return width_; }
  int64_t operator[](int64_t i) const;
  // Copies tokens [begin, begin + count) into out.
  void read(int64_t begin, int64_t count, int64_t* out) const;
  std::vector<int64_t> to_vector() const;

 private:
  struct Mapping;
  std::shared_ptr<const Mapping> mapping_;
  const uint8_t* tokens_ = nullptr;
  std::string path_;
  int64_t size_ = 0;
  int width_ = 2;
};

// A whole shard as int64 tokens; with vocab_size > 0 an id >= vocab_size is an error that
// names the file, the position and the id.
std::vector<int64_t> load_shard(const std::string& path, int64_t vocab_size = 0);

// The files a pattern names, sorted ("data/*_train_*.bin"); a name without wildcards is
// returned as it is. A pattern that matches nothing is an error.
std::vector<std::string> expand_shard_paths(const std::string& pattern);

// Shards concatenated into one stream of tokens, with the batching of TokenStream: windows
// of seq_len + 1 tokens (they may cross from one shard into the next), doc_ids counting
// document starts and positions restarting at each one.
class ShardDataset : public TokenSource {
 public:
  // `paths` holds files or glob patterns; vocab_size > 0 validates every token.
  ShardDataset(const std::vector<std::string>& paths, int64_t vocab_size, int64_t document_start_id);

  int64_t size() const override { return offsets_.back(); }
  const std::vector<Shard>& shards() const { return shards_; }
  int64_t document_start_id() const override { return document_start_id_; }

  void read(int64_t begin, int64_t count, int64_t* out) const override;
  std::vector<int64_t> tokens(int64_t begin, int64_t count) const;
  std::vector<int64_t> tokens() const { return tokens(0, size()); }  // e.g. for a TokenStream

 private:
  std::vector<Shard> shards_;
  std::vector<int64_t> offsets_;  // offsets_[i] = first token of shard i; back() = total
  int64_t document_start_id_;
};

// `ham tokenize`: text files -> train and validation shards PREFIX_{train,val}_NNNNNN.bin.
struct TokenizeOptions {
  int64_t shard_tokens = 100'000'000;  // tokens per shard (the last one may hold fewer)
  double validation_fraction = 0.0;    // the last documents, as TokenStream::from_text
  bool one_document_per_file = false;  // else documents end at lines "<|endoftext|>"
};

struct TokenizeSummary {
  int token_width = 2;
  int64_t train_documents = 0, train_tokens = 0;
  int64_t val_documents = 0, val_tokens = 0;
  std::vector<std::string> train_shards, val_shards;
};

TokenizeSummary tokenize_to_shards(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                                   const std::string& out_prefix, const TokenizeOptions& options);

}  // namespace ham
