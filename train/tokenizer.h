#pragma once
// Tokenizers: text <-> token ids.
//
//   RawBytesTokenizer  ids 0..255 are bytes, 256 is <|endoftext|> (the ids of ByteTokenizer in
//                      train/text_data.h, so byte-level checkpoints and data stay valid).
//   BpeTokenizer       a Hugging Face tokenizer.json with a BPE model, in one of two styles:
//     byte-level       (GPT-2): bytes map to printable characters, text is split into words
//                      by the GPT-2 pattern, merges join characters by rank;
//     sentencepiece    (Llama-2): spaces become "▁", "▁" is prepended, merges run by rank,
//                      characters missing from the vocabulary fall back to <0xHH> tokens.
//
// encode() treats special-token text such as "<|endoftext|>" as ordinary text (a document
// that quotes the marker must not end there); encode_with_special() turns it into the id.
// decode() maps ids back to bytes (special tokens to their text). All methods are const and
// safe to call from several threads.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ham {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  virtual std::vector<int64_t> encode_with_special(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;  // ids are in [0, vocab_size)
  // The bytes of text an id stands for: 0 for special tokens (a document's start or end),
  // which hold no text; a sentencepiece word-start marker counts as its space. Bits per
  // byte divide a loss by these, so models with different tokenizers compare.
  virtual int64_t text_bytes(int64_t id) const = 0;
  virtual int64_t eot_id() const = 0;      // end-of-text token, -1 when there is none
  virtual int64_t bos_id() const = 0;      // beginning-of-sequence token, -1 when none
  virtual std::string name() const = 0;    // for messages: "bytes" or the file and style

  // The token written before every document in llm.c shards: BOS when the tokenizer has
  // one (Llama's <s>), else EOT (GPT-2's <|endoftext|>, the bytes tokenizer's 256).
  int64_t document_start_id() const { return bos_id() >= 0 ? bos_id() : eot_id(); }
};

class RawBytesTokenizer final : public Tokenizer {
 public:
  static constexpr int64_t kEndOfText = 256;
  static constexpr int64_t kVocabSize = 257;
  std::vector<int64_t> encode(std::string_view text) const override;
  std::vector<int64_t> encode_with_special(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  int64_t text_bytes(int64_t id) const override;
  int64_t eot_id() const override { return kEndOfText; }
  int64_t bos_id() const override { return -1; }
  std::string name() const override { return "bytes"; }
};

class BpeTokenizer final : public Tokenizer {
 public:
  enum class Style { kByteLevel, kSentencePiece };

  // Reads a tokenizer.json; a missing or malformed field throws a one-line ham::Error
  // naming the file and the field.
  static BpeTokenizer from_tokenizer_json(const std::string& path);
  // The same from a parsed document; `source` names it in error messages.
  static BpeTokenizer from_json(const nlohmann::json& document, const std::string& source);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer() override;

  std::vector<int64_t> encode(std::string_view text) const override;
  std::vector<int64_t> encode_with_special(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override;
  int64_t text_bytes(int64_t id) const override;
  int64_t eot_id() const override;
  int64_t bos_id() const override;
  std::string name() const override;

  Style style() const;
  // The id of a vocabulary piece or added token ("Ġthe", "▁the", "<s>"), -1 when absent.
  int64_t token_id(std::string_view piece) const;
  // The piece string of an id as written in the tokenizer.json.
  const std::string& piece(int64_t id) const;

  struct Impl;  // defined in tokenizer.cpp

 private:
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "bytes" selects RawBytesTokenizer; anything else is read as a tokenizer.json path.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

// The GPT-2 pre-tokenizer: splits text like the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with Unicode letters, numbers and white space. Bytes that are not valid UTF-8 count as
// "other" characters. The pieces are views into `text` and concatenate back to it.
std::vector<std::string_view> split_gpt2_pretokens(std::string_view text);

// Whether this build has the Unicode character classes that split_gpt2_pretokens (and so
// the byte-level BPE tokenizer) needs: false when configured with -DHAM_ICU=OFF, where
// they fail with a one-line error.
bool has_unicode_classes();

// GPT-2's reversible byte -> character map (printable bytes map to themselves, the others
// to U+0100 and up), as UTF-8.
std::string byte_level_char(uint8_t byte);

}  // namespace ham
