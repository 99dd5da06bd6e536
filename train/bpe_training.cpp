#include "train/bpe_training.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <queue>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "train/text_data.h"
#include "train/tokenizer.h"

namespace ham {

namespace {

constexpr std::string_view kEndOfTextText = "<|endoftext|>";

uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }
int32_t left_of(uint64_t key) { return int32_t(uint32_t(key >> 32)); }
int32_t right_of(uint64_t key) { return int32_t(uint32_t(key)); }

// Each byte's place among the 256 byte-level characters sorted by code point: Hugging
// Face's trainer numbers them in that order after the special token.
const std::array<int32_t, 256>& byte_character_order() {
  static const std::array<int32_t, 256> order = [] {
    std::array<std::pair<std::string, int>, 256> by_character;
    for (int b = 0; b < 256; ++b) by_character[size_t(b)] = {byte_level_char(uint8_t(b)), b};
    // UTF-8 byte order is code-point order.
    std::sort(by_character.begin(), by_character.end());
    std::array<int32_t, 256> o{};
    for (int i = 0; i < 256; ++i) o[size_t(by_character[size_t(i)].second)] = i;
    return o;
  }();
  return order;
}

// A pair waiting to be merged. The queue keeps stale counts (a merge lowers the counts of
// the pairs around it); a popped entry whose count is no longer the pair's is put back
// with the current one, so the entry that wins is the true maximum.
struct Candidate {
  int64_t count;
  int32_t left_order, right_order;  // ids in Hugging Face's numbering, for ties
  uint64_t pair;
  bool operator<(const Candidate& other) const {  // "less urgent than"
    if (count != other.count) return count < other.count;
    if (left_order != other.left_order) return left_order > other.left_order;
    return right_order > other.right_order;
  }
};

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

class MergeLearner {
 public:
  MergeLearner(std::vector<WordCount> counted, int64_t vocab_size, int64_t min_frequency)
      : vocab_size_(vocab_size), min_frequency_(min_frequency) {
    learned_.pieces.reserve(size_t(vocab_size));
    for (int b = 0; b < 256; ++b) {
      learned_.pieces.emplace_back(1, char(b));
      id_of_piece_.emplace(learned_.pieces.back(), b);
    }
    learned_.pieces.emplace_back(kEndOfTextText);  // id 256; never a merge's piece
    HAM_CHECK(counted.size() < size_t(INT32_MAX), "learn_bpe_merges: ", counted.size(),
              " distinct words; at most 2^31 - 1 are supported");
    words_.reserve(counted.size());
    for (auto& wc : counted) {
      if (wc.word.empty() || wc.count <= 0) continue;
      Word w{{}, wc.count};
      w.symbols.reserve(wc.word.size());
      for (unsigned char c : wc.word) w.symbols.push_back(int32_t(c));
      learned_.symbols_before += wc.count * int64_t(wc.word.size());
      words_.push_back(std::move(w));
      std::string().swap(wc.word);
    }
    visited_at_.assign(words_.size(), -1);
    for (size_t w = 0; w < words_.size(); ++w) {
      const auto& s = words_[w].symbols;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        uint64_t p = pair_key(s[i], s[i + 1]);
        pair_counts_[p] += words_[w].count;
        auto& where = pair_words_[p];
        if (where.empty() || where.back() != int32_t(w)) where.push_back(int32_t(w));
      }
    }
    for (const auto& [p, count] : pair_counts_) queue_.push(candidate(p, count));
  }

  LearnedMerges run() {
    while (int64_t(learned_.pieces.size()) < vocab_size_ && !queue_.empty()) {
      Candidate top = queue_.top();
      queue_.pop();
      auto found = pair_counts_.find(top.pair);
      const int64_t current = found == pair_counts_.end() ? 0 : found->second;
      if (current != top.count) {
        // Lowered since it was queued: back in line with the current count. (A pair whose
        // count rose was queued again then, so this older entry is dropped.)
        if (current > 0 && current < top.count) queue_.push(candidate(top.pair, current));
        continue;
      }
      if (current < min_frequency_) break;
      merge(top.pair);
    }
    learned_.vocabulary_full = int64_t(learned_.pieces.size()) >= vocab_size_;
    for (const auto& w : words_) learned_.symbols_after += w.count * int64_t(w.symbols.size());
    return std::move(learned_);
  }

 private:
  int32_t order(int32_t id) const { return id < 256 ? byte_character_order()[size_t(id)] + 1 : id; }
  Candidate candidate(uint64_t p, int64_t count) const {
    return {count, order(left_of(p)), order(right_of(p)), p};
  }

  void merge(uint64_t pair) {
    const int32_t left = left_of(pair), right = right_of(pair);
    std::string piece = learned_.pieces[size_t(left)] + learned_.pieces[size_t(right)];
    const int32_t result = int32_t(learned_.pieces.size());
    HAM_CHECK(id_of_piece_.emplace(piece, result).second, "learn_bpe_merges: internal error: merge ",
              learned_.merges.size() + 1, " makes a piece an earlier merge made");
    learned_.pieces.push_back(std::move(piece));
    learned_.merges.emplace_back(left, right);
    const int32_t step = int32_t(learned_.merges.size());

    std::vector<int32_t> where = std::move(pair_words_[pair]);
    pair_words_.erase(pair);
    std::vector<uint64_t> raised;  // pairs whose count went up: queued again below
    std::vector<uint64_t> new_in_word;
    for (int32_t w : where) {
      if (visited_at_[size_t(w)] == step) continue;  // listed twice
      visited_at_[size_t(w)] = step;
      Word& word = words_[size_t(w)];
      std::vector<int32_t>& s = word.symbols;
      bool holds_pair = false;
      for (size_t i = 0; i + 1 < s.size() && !holds_pair; ++i) holds_pair = s[i] == left && s[i + 1] == right;
      if (!holds_pair) continue;  // an older listing: an earlier merge took the pair apart
      // The word's pairs leave the counts, the word is merged, its new pairs come back in.
      for (size_t i = 0; i + 1 < s.size(); ++i) pair_counts_[pair_key(s[i], s[i + 1])] -= word.count;
      size_t out = 0;
      for (size_t i = 0; i < s.size(); ++out) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          s[out] = result;
          i += 2;
        } else {
          s[out] = s[i];
          i += 1;
        }
      }
      s.resize(out);
      new_in_word.clear();
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        uint64_t p = pair_key(s[i], s[i + 1]);
        pair_counts_[p] += word.count;
        // Only pairs with the new symbol can be new to this word.
        if (s[i] == result || s[i + 1] == result) new_in_word.push_back(p);
      }
      std::sort(new_in_word.begin(), new_in_word.end());
      new_in_word.erase(std::unique(new_in_word.begin(), new_in_word.end()), new_in_word.end());
      for (uint64_t p : new_in_word) {
        pair_words_[p].push_back(w);
        raised.push_back(p);
      }
    }
    auto gone = pair_counts_.find(pair);
    HAM_CHECK(gone == pair_counts_.end() || gone->second == 0, "learn_bpe_merges: internal error: merge ",
              step, " left ", gone == pair_counts_.end() ? 0 : gone->second, " occurrences of its pair");
    if (gone != pair_counts_.end()) pair_counts_.erase(gone);
    std::sort(raised.begin(), raised.end());
    raised.erase(std::unique(raised.begin(), raised.end()), raised.end());
    for (uint64_t p : raised) queue_.push(candidate(p, pair_counts_[p]));
  }

  int64_t vocab_size_, min_frequency_;
  LearnedMerges learned_;
  std::unordered_map<std::string, int32_t> id_of_piece_;  // bytes -> id (not the special token)
  std::vector<Word> words_;
  std::vector<int32_t> visited_at_;                              // the merge step that last visited a word
  std::unordered_map<uint64_t, int64_t> pair_counts_;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words_;  // words that may hold the pair
  std::priority_queue<Candidate> queue_;
};

using OrderedJson = nlohmann::ordered_json;

std::string byte_level_text(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) out += byte_level_char(c);
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void check_sizes(int64_t vocab_size, int64_t min_frequency) {
  HAM_CHECK(vocab_size >= 257 && vocab_size <= INT32_MAX, "train-tokenizer: --vocab-size must be in [257, 2^31) ",
            "(the 256 bytes and <|endoftext|> come first), got ", vocab_size);
  HAM_CHECK(min_frequency >= 1, "train-tokenizer: --min-frequency must be at least 1, got ", min_frequency);
}

}  // namespace

LearnedMerges learn_bpe_merges(std::vector<WordCount> words, int64_t vocab_size, int64_t min_frequency) {
  check_sizes(vocab_size, min_frequency);
  return MergeLearner(std::move(words), vocab_size, min_frequency).run();
}

std::vector<WordCount> count_pretokens(const std::vector<std::string>& documents) {
  using Counts = std::unordered_map<std::string_view, int64_t>;  // views into `documents`
  const int threads = std::max(1, omp_get_max_threads());
  std::vector<Counts> per_thread(static_cast<size_t>(threads));
#pragma omp parallel num_threads(threads)
  {
    Counts& counts = per_thread[size_t(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (int64_t d = 0; d < int64_t(documents.size()); ++d) {
      for (std::string_view word : split_gpt2_pretokens(documents[size_t(d)])) ++counts[word];
    }
  }
  Counts& all = per_thread[0];
  for (size_t t = 1; t < per_thread.size(); ++t) {
    for (const auto& [word, count] : per_thread[t]) all[word] += count;
    Counts().swap(per_thread[t]);
  }
  std::vector<WordCount> out;
  out.reserve(all.size());
  for (const auto& [word, count] : all) out.push_back({std::string(word), count});
  return out;
}

std::string byte_level_tokenizer_json(const LearnedMerges& learned) {
  const OrderedJson byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  // Built from a list of its entries: inserting 32K keys one by one into an ordered_json
  // object searches the keys before it each time. The pieces are distinct.
  std::vector<std::pair<std::string, OrderedJson>> entries;
  entries.reserve(learned.pieces.size());
  for (size_t id = 0; id < learned.pieces.size(); ++id) {
    if (id == size_t(LearnedMerges::kEndOfText)) continue;  // an added token, not a BPE piece
    entries.emplace_back(byte_level_text(learned.pieces[id]), id);
  }
  OrderedJson vocab = OrderedJson::object_t(entries.begin(), entries.end());
  OrderedJson merges = OrderedJson::array();
  for (const auto& [left, right] : learned.merges) {
    merges.push_back({byte_level_text(learned.pieces[size_t(left)]), byte_level_text(learned.pieces[size_t(right)])});
  }
  OrderedJson document = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {{{"id", LearnedMerges::kEndOfText},
         {"content", std::string(kEndOfTextText)},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false},
         {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor", nullptr},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", std::move(vocab)},
        {"merges", std::move(merges)}}}};
  return document.dump(1) + "\n";
}

BpeTrainingSummary train_bpe_tokenizer(const std::vector<std::string>& inputs, const std::string& out_path,
                                       const BpeTrainingOptions& options) {
  HAM_CHECK(!inputs.empty(), "train-tokenizer: no input files");
  HAM_CHECK(options.validation_fraction >= 0 && options.validation_fraction < 1,
            "train-tokenizer: --val-fraction must be in [0, 1), got ", options.validation_fraction);
  check_sizes(options.vocab_size, options.min_frequency);
  HAM_CHECK(has_unicode_classes(), "train-tokenizer: the GPT-2 pre-tokenizer needs ICU's Unicode classes, "
            "and this build has none (configure with -DHAM_ICU=ON and libicu-dev installed)");

  BpeTrainingSummary summary;
  auto start = std::chrono::steady_clock::now();
  std::vector<std::string> documents;
  for (const auto& path : inputs) {
    for (auto& document : read_documents(path, options.one_document_per_file)) documents.push_back(std::move(document));
  }
  HAM_CHECK(!documents.empty(), "train-tokenizer: the input files hold no text");
  summary.held_out_documents = held_out_documents(int64_t(documents.size()), options.validation_fraction);
  documents.resize(documents.size() - size_t(summary.held_out_documents));
  summary.documents = int64_t(documents.size());
  std::vector<WordCount> words = count_pretokens(documents);
  std::vector<std::string>().swap(documents);
  summary.distinct_words = int64_t(words.size());
  for (const auto& w : words) summary.pretokens += w.count;
  summary.counting_seconds = seconds_since(start);

  start = std::chrono::steady_clock::now();
  summary.learned = learn_bpe_merges(std::move(words), options.vocab_size, options.min_frequency);
  summary.merging_seconds = seconds_since(start);

  write_file_atomically(out_path, byte_level_tokenizer_json(summary.learned));
  return summary;
}

}  // namespace ham
