#include "train/bpe_training.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "tests/error_testing.h"
#include "tests/testing.h"
#include "train/text_data.h"
#include "train/tokenizer.h"

namespace ham {
namespace {

using testing::expect_error;
using Merge = std::pair<std::string, std::string>;

// The GPT-2 pre-tokenizer needs ICU's Unicode classes (absent with -DHAM_ICU=OFF).
#define SKIP_UNLESS_UNICODE_CLASSES() \
  if (!has_unicode_classes()) GTEST_SKIP() << "this build has no ICU (configured with -DHAM_ICU=OFF)"

std::vector<Merge> merges_as_text(const LearnedMerges& learned) {
  std::vector<Merge> out;
  for (const auto& [left, right] : learned.merges) {
    out.emplace_back(learned.pieces[size_t(left)], learned.pieces[size_t(right)]);
  }
  return out;
}

BpeTokenizer tokenizer_of(const LearnedMerges& learned) {
  return BpeTokenizer::from_json(nlohmann::json::parse(byte_level_tokenizer_json(learned)), "learned");
}

// The tokens the tokenizer gives each word, weighted by the word's count.
int64_t encoded_tokens(const BpeTokenizer& tokenizer, const std::vector<WordCount>& words) {
  int64_t tokens = 0;
  for (const auto& w : words) tokens += w.count * int64_t(tokenizer.encode(w.word).size());
  return tokens;
}

// Hugging Face's course example, counted by hand: u g 20, then u n 16, h ug 15, p un 12;
// p ug and hug s tie at 5 and p (a byte) comes before hug (a merge); b un 4 last.
TEST(BpeTraining, MergesTheMostFrequentPairFirstAndBreaksTiesByHuggingFaceIds) {
  std::vector<WordCount> words = {{"hug", 10}, {"pug", 5}, {"pun", 12}, {"bun", 4}, {"hugs", 5}};
  LearnedMerges learned = learn_bpe_merges(words, 1000, 1);
  std::vector<Merge> expected = {{"u", "g"},  {"u", "n"},   {"h", "ug"}, {"p", "un"},
                                 {"p", "ug"}, {"hug", "s"}, {"b", "un"}};
  EXPECT_EQ(merges_as_text(learned), expected);
  EXPECT_FALSE(learned.vocabulary_full);  // every word is one symbol: nothing left to merge
  EXPECT_EQ(learned.pieces.size(), 257u + 7u);
  EXPECT_EQ(learned.symbols_before, 10 * 3 + 5 * 3 + 12 * 3 + 4 * 3 + 5 * 4);
  EXPECT_EQ(learned.symbols_after, 10 + 5 + 12 + 4 + 5);
  EXPECT_EQ(learned.pieces.back(), "bun");
}

// Byte 0x0A is the character U+010A in the byte-level alphabet, 'a' is U+0061: Hugging
// Face numbers 'a' first, so ("a", "x") wins the tie though byte 0x0A < 'a'.
TEST(BpeTraining, TiesBetweenBytesFollowTheByteLevelCharactersOrder) {
  LearnedMerges learned = learn_bpe_merges({{"\nx", 3}, {"ax", 3}}, 258, 1);
  EXPECT_EQ(merges_as_text(learned), (std::vector<Merge>{{"a", "x"}}));
  EXPECT_TRUE(learned.vocabulary_full);
  learned = learn_bpe_merges({{"\nx", 4}, {"ax", 3}}, 258, 1);
  EXPECT_EQ(merges_as_text(learned), (std::vector<Merge>{{"\n", "x"}}));
}

// a a a a a: (a, a) merges left to right -> aa aa a; then (aa, a) beats (aa, aa) on the
// tie (a byte's id is smaller than a merge's) -> aa aaa; then (aa, aaa).
TEST(BpeTraining, RunsOfOneByteMergeLeftToRight) {
  SKIP_UNLESS_UNICODE_CLASSES();
  LearnedMerges learned = learn_bpe_merges({{"aaaaa", 1}}, 1000, 1);
  EXPECT_EQ(merges_as_text(learned), (std::vector<Merge>{{"a", "a"}, {"aa", "a"}, {"aa", "aaa"}}));
  EXPECT_EQ(learned.symbols_after, 1);
  BpeTokenizer tokenizer = tokenizer_of(learned);
  EXPECT_EQ(tokenizer.encode("aaaaa").size(), 1u);
  const int64_t aa = tokenizer.token_id("aa"), aaa = tokenizer.token_id("aaa");
  EXPECT_EQ(tokenizer.encode("aaaa"), (std::vector<int64_t>{aa, aa}));
  EXPECT_EQ(tokenizer.encode("aaa"), (std::vector<int64_t>{aaa}));
}

TEST(BpeTraining, StopsAtTheVocabularySizeOrTheMinimumFrequency) {
  std::vector<WordCount> words = {{"abab", 3}, {"cd", 2}, {"ef", 1}};
  // (a, b) 6, then (ab, ab) 3, (c, d) 2, (e, f) 1.
  LearnedMerges learned = learn_bpe_merges(words, 259, 1);
  EXPECT_EQ(merges_as_text(learned), (std::vector<Merge>{{"a", "b"}, {"ab", "ab"}}));
  EXPECT_TRUE(learned.vocabulary_full);
  learned = learn_bpe_merges(words, 1000, 2);
  EXPECT_EQ(merges_as_text(learned), (std::vector<Merge>{{"a", "b"}, {"ab", "ab"}, {"c", "d"}}));
  EXPECT_FALSE(learned.vocabulary_full);
  learned = learn_bpe_merges(words, 257, 1);
  EXPECT_TRUE(learned.merges.empty());
  EXPECT_EQ(learned.symbols_after, learned.symbols_before);
}

// The tokenizer.json the trainer writes, read back by BpeTokenizer, encodes each training
// document to the symbols training left it with and decodes it back to its bytes.
TEST(BpeTraining, TheTokenizerEncodesTheTrainingTextAsTrainingLeftIt) {
  SKIP_UNLESS_UNICODE_CLASSES();
  std::vector<std::string> documents = split_documents(default_corpus());
  LearnedMerges learned = learn_bpe_merges(count_pretokens(documents), 1000, 2);
  ASSERT_TRUE(learned.vocabulary_full);
  EXPECT_EQ(learned.merges.size(), 1000u - 257u);
  BpeTokenizer tokenizer = tokenizer_of(learned);
  EXPECT_EQ(tokenizer.vocab_size(), 1000);
  EXPECT_EQ(tokenizer.eot_id(), 256);
  EXPECT_EQ(tokenizer.document_start_id(), 256);
  int64_t tokens = 0, bytes = 0;
  for (const auto& document : documents) {
    std::vector<int64_t> ids = tokenizer.encode(document);
    tokens += int64_t(ids.size());
    bytes += int64_t(document.size());
    ASSERT_EQ(tokenizer.decode(ids), document);
    int64_t text_bytes = 0;  // what bits per byte divide by
    for (int64_t id : ids) text_bytes += tokenizer.text_bytes(id);
    ASSERT_EQ(text_bytes, int64_t(document.size()));
  }
  EXPECT_EQ(tokens, learned.symbols_after);
  EXPECT_EQ(bytes, learned.symbols_before);
  EXPECT_LT(double(tokens), 0.45 * double(bytes));  // English text: about 3 bytes a token at 1000 ids
  // Bytes keep their own ids; the marker is one token only where asked for.
  EXPECT_EQ(tokenizer.encode("\x01\xff"), (std::vector<int64_t>{1, 255}));
  EXPECT_EQ(tokenizer.encode_with_special("<|endoftext|>"), (std::vector<int64_t>{256}));
  EXPECT_EQ(tokenizer.text_bytes(256), 0);
  EXPECT_GT(tokenizer.encode("<|endoftext|>").size(), 1u);
}

// Words over three letters, full of overlapping runs and ties, until no pair is left: every
// merge makes a new piece, and the tokenizer encodes each word as training left it.
TEST(BpeTraining, RandomWordsEncodeAsTrainedAndEveryMergeMakesANewPiece) {
  SKIP_UNLESS_UNICODE_CLASSES();
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::mt19937 rng(seed);
    std::vector<WordCount> words;
    std::set<std::string> seen;
    while (words.size() < 60) {
      std::string word(size_t(1 + rng() % 10), 'a');
      for (char& c : word) c = char('a' + rng() % 3);
      if (seen.insert(word).second) words.push_back({word, int64_t(1 + rng() % 6)});
    }
    LearnedMerges learned = learn_bpe_merges(words, 600, 1);
    ASSERT_FALSE(learned.vocabulary_full) << "seed " << seed << ": stopped before every pair was merged";
    std::set<std::string> pieces(learned.pieces.begin(), learned.pieces.end());
    ASSERT_EQ(pieces.size(), learned.pieces.size()) << "seed " << seed << ": a piece has two ids";
    ASSERT_EQ(encoded_tokens(tokenizer_of(learned), words), learned.symbols_after) << "seed " << seed;
    int64_t word_count = 0;  // every word is one symbol once no pair is left
    for (const auto& w : words) word_count += w.count;
    ASSERT_EQ(learned.symbols_after, word_count) << "seed " << seed;
  }
}

TEST(BpeTraining, CountsAndMergesDoNotDependOnThreadsOrWordOrder) {
  SKIP_UNLESS_UNICODE_CLASSES();
  std::vector<std::string> documents = split_documents(default_corpus());
  auto sorted_counts = [&](int threads) {
    testing::ScopedThreadCount scoped(threads);
    std::vector<WordCount> words = count_pretokens(documents);
    std::sort(words.begin(), words.end(), [](const WordCount& a, const WordCount& b) { return a.word < b.word; });
    return words;
  };
  std::vector<WordCount> one = sorted_counts(1), three = sorted_counts(3);
  ASSERT_EQ(one.size(), three.size());
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(one[i].word, three[i].word);
    ASSERT_EQ(one[i].count, three[i].count) << one[i].word;
  }
  std::vector<WordCount> shuffled = one;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
  EXPECT_EQ(byte_level_tokenizer_json(learn_bpe_merges(one, 700, 2)),
            byte_level_tokenizer_json(learn_bpe_merges(shuffled, 700, 2)));
}

class BpeTrainingFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string file(const std::string& name, const std::string& contents) const {
    std::ofstream(path(name), std::ios::binary) << contents;
    return path(name);
  }
  std::filesystem::path dir_;
};

TEST_F(BpeTrainingFiles, WritesATokenizerFileAndLeavesOutTheValidationDocuments) {
  SKIP_UNLESS_UNICODE_CLASSES();
  std::string a = file("a.txt", "the cat sat\n<|endoftext|>\nthe cat ran\n");
  std::string b = file("b.txt", "zyzzyva zyzzyva zyzzyva\n");  // the last document: held out
  BpeTrainingOptions options;
  options.vocab_size = 300;
  options.min_frequency = 2;
  options.validation_fraction = 0.3;
  BpeTrainingSummary s = train_bpe_tokenizer({a, b}, path("tokenizer.json"), options);
  EXPECT_EQ(s.documents, 2);
  EXPECT_EQ(s.held_out_documents, 1);
  // "the", " cat" and "\n" twice each, " sat" and " ran" once.
  EXPECT_EQ(s.pretokens, 8);
  for (const auto& piece : s.learned.pieces) EXPECT_EQ(piece.find("zy"), std::string::npos) << piece;
  std::unique_ptr<Tokenizer> loaded = load_tokenizer(path("tokenizer.json"));
  EXPECT_EQ(loaded->encode(" cat").size(), 1u);
  EXPECT_EQ(loaded->vocab_size(), int64_t(s.learned.pieces.size()));
  // Only the file itself is left in the directory: no temporary beside it.
  int64_t entries = std::distance(std::filesystem::directory_iterator(dir_), std::filesystem::directory_iterator());
  EXPECT_EQ(entries, 3);
  options.validation_fraction = 0;
  s = train_bpe_tokenizer({a, b}, path("tokenizer.json"), options);
  EXPECT_EQ(s.held_out_documents, 0);
  EXPECT_NE(load_tokenizer(path("tokenizer.json"))->encode("zyzzyva").size(), 7u);
}

TEST_F(BpeTrainingFiles, BadInputIsAOneLineErrorNamingIt) {
  SKIP_UNLESS_UNICODE_CLASSES();
  std::string text = file("a.txt", "some text some text\n");
  std::string out = path("tokenizer.json");
  BpeTrainingOptions options;
  options.vocab_size = 256;
  expect_error([&] { train_bpe_tokenizer({text}, out, options); }, {"--vocab-size", "257", "256"});
  options.vocab_size = 300;
  options.min_frequency = 0;
  expect_error([&] { train_bpe_tokenizer({text}, out, options); }, {"--min-frequency", "0"});
  options.min_frequency = 2;
  options.validation_fraction = 1;
  expect_error([&] { train_bpe_tokenizer({text}, out, options); }, {"--val-fraction", "[0, 1)"});
  options.validation_fraction = 0;
  expect_error([&] { train_bpe_tokenizer({path("missing.txt")}, out, options); },
               {"missing.txt", "cannot read", "No such file"});
  expect_error([&] { train_bpe_tokenizer({dir_.string()}, out, options); }, {dir_.string(), "directory"});
  std::string empty = file("empty.txt", "<|endoftext|>\n");
  expect_error([&] { train_bpe_tokenizer({empty}, out, options); }, {"hold no text"});
  expect_error([&] { train_bpe_tokenizer({text}, path("no/such/dir/tokenizer.json"), options); },
               {"no/such/dir/tokenizer.json", "cannot write"});
  EXPECT_FALSE(std::filesystem::exists(out));  // nothing written by a failed run
}

}  // namespace
}  // namespace ham
