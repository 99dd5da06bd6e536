#pragma once
// Text data for training: documents split into train/validation, encoded as bytes (ids
// 0..255 are bytes, 256 marks a document start) or by a tokenizer, and random windows
// packed into batches with document ids and restarting positions.
#include <string>
#include <string_view>
#include <vector>

#include "core/random.h"
#include "models/language_model.h"

namespace ham {

class Tokenizer;  // train/tokenizer.h

std::string_view default_corpus();  // the embedded text (generated at build time)

class ByteTokenizer {
 public:
  static constexpr int64_t kEndOfText = 256;
  static constexpr int64_t kVocabSize = 257;
  std::vector<int64_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int64_t>& ids) const;
};

// Splits text at lines holding only "<|endoftext|>"; empty documents are dropped.
std::vector<std::string> split_documents(std::string_view text);
// A text file's documents: the whole file (when not empty) or split_documents of it. A
// file that cannot be read is an error naming it.
std::vector<std::string> read_documents(const std::string& path, bool one_document_per_file);
// How many of the last documents a validation fraction holds out: none for a fraction of 0
// or fewer than 2 documents, else at least one. TokenStream::from_text, `ham tokenize` and
// `ham train-tokenizer` hold out the same documents.
int64_t held_out_documents(int64_t total_documents, double validation_fraction);

// Where training and validation batches come from: an in-memory TokenStream or token
// shards on disk (train/shards.h). Both read as one stream of token ids in which
// document_start_id() opens every document; windows are packed the same way for both.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;
  // Copies tokens [begin, begin + count) into out.
  virtual void read(int64_t begin, int64_t count, int64_t* out) const = 0;
  virtual int64_t document_start_id() const = 0;

  // Windows of seq_len + 1 tokens at `starts`: inputs are the first seq_len, targets the
  // last seq_len; doc_ids count document starts inside the window and positions restart
  // at each.
  TokenBatch batch_at(const std::vector<int64_t>& starts, int64_t seq_len) const;
  // `batch` windows at random starts drawn from `gen`.
  TokenBatch sample(int64_t batch, int64_t seq_len, Generator& gen) const;
  // Consecutive non-overlapping windows covering the source (for validation loss).
  std::vector<TokenBatch> sequential(int64_t batch, int64_t seq_len, int64_t max_batches) const;
};

class TokenStream : public TokenSource {
 public:
  // Each document becomes [EOT, bytes...], or with a tokenizer [its document start,
  // encode(document)...]; the last `validation_fraction` of documents (at least one when
  // there are two or more) form the validation stream.
  static std::pair<TokenStream, TokenStream> from_text(std::string_view text,
                                                       double validation_fraction,
                                                       const std::string& source,
                                                       const Tokenizer* tokenizer = nullptr);
  explicit TokenStream(std::vector<int64_t> tokens, int64_t document_start_id = ByteTokenizer::kEndOfText)
      : tokens_(std::move(tokens)), document_start_id_(document_start_id) {}
  int64_t size() const override { return int64_t(tokens_.size()); }
  const std::vector<int64_t>& tokens() const { return tokens_; }

  void read(int64_t begin, int64_t count, int64_t* out) const override;
  int64_t document_start_id() const override { return document_start_id_; }

 private:
  std::vector<int64_t> tokens_;
  int64_t document_start_id_;
};

}  // namespace ham
