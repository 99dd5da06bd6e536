#pragma once
// Learning a byte-level BPE tokenizer (GPT-2 style) from text, so that a model can train on
// subword tokens without a Python tokenizer library. The result is a Hugging Face
// tokenizer.json that BpeTokenizer (train/tokenizer.h) and Hugging Face's tokenizers load.
//
//   1. Documents (split at lines '<|endoftext|>', as `ham tokenize` splits them) are cut into
//      words by the GPT-2 pre-tokenizer; each distinct word is kept once with its count n_w.
//   2. Every word starts as its bytes: ids 0..255 are the bytes, 256 is <|endoftext|>, so a
//      tokenizer of 257 ids is `ham tokenize --tokenizer bytes` again.
//   3. Each step merges the adjacent pair (a, b) with the largest count
//        count(a, b) = sum_w n_w * (occurrences of a b in word w)
//      into one symbol, left to right within each word (a a a -> aa a), until the vocabulary
//      holds vocab_size ids or no pair occurs min_frequency times. Ties go to the pair whose
//      ids come first in Hugging Face's numbering (the special token, the 256 byte
//      characters in code-point order, then the merges in order), so on the same documents
//      both trainers learn the same merges.
//
// Each merge makes a piece no earlier merge made: the merges that build a symbol happen
// inside its own bytes, in rank order, whatever surrounds it (a merge across its edge would
// have given a different symbol), so a piece's bytes fix the merge that made it.
//
// Encoding a training word with the learned merges by rank (BpeTokenizer::encode) gives the
// symbols training left it with, so LearnedMerges::tokens is what the documents encode to.
#include <cstdint>
#include <string>
#include <vector>

namespace ham {

struct WordCount {
  std::string word;  // bytes
  int64_t count = 0;
};

struct LearnedMerges {
  static constexpr int32_t kEndOfText = 256;  // the special token's id; merges start at 257
  std::vector<std::string> pieces;            // the bytes of each id; pieces[256] = "<|endoftext|>"
  std::vector<std::pair<int32_t, int32_t>> merges;  // (left id, right id), by rank
  // Merge i makes id 257 + i.
  int64_t symbols_before = 0;    // sum_w n_w * bytes(w)
  int64_t symbols_after = 0;     // sum_w n_w * symbols(w) after every merge
  bool vocabulary_full = false;  // else it stopped because no pair occurred min_frequency times
};

// Step 3 on counted words. vocab_size counts the 256 bytes and <|endoftext|>: >= 257.
LearnedMerges learn_bpe_merges(std::vector<WordCount> words, int64_t vocab_size, int64_t min_frequency);

// Step 1: the GPT-2 pre-tokens of the documents with their counts, in no particular order
// (documents are split among the OpenMP threads).
std::vector<WordCount> count_pretokens(const std::vector<std::string>& documents);

// The tokenizer.json text (vocabulary in id order, merges as ["a", "b"] pairs, a ByteLevel
// pre-tokenizer and decoder, <|endoftext|> as an added special token).
std::string byte_level_tokenizer_json(const LearnedMerges& learned);

// `ham train-tokenizer`: text files -> tokenizer.json.
struct BpeTrainingOptions {
  int64_t vocab_size = 4096;
  int64_t min_frequency = 2;
  double validation_fraction = 0.0;    // the last documents are left out, as `ham tokenize` holds them out
  bool one_document_per_file = false;  // else documents end at lines "<|endoftext|>"
};

struct BpeTrainingSummary {
  int64_t documents = 0, held_out_documents = 0;
  int64_t pretokens = 0, distinct_words = 0;
  LearnedMerges learned;
  double counting_seconds = 0, merging_seconds = 0;
};

// Reads the documents, learns the merges and writes `out_path` atomically (a temporary file
// beside it, renamed over it). Errors name the file or option at fault.
BpeTrainingSummary train_bpe_tokenizer(const std::vector<std::string>& inputs, const std::string& out_path,
                                       const BpeTrainingOptions& options);

}  // namespace ham
