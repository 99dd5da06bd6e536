#include "train/tokenizer.h"
#include "tests/error_testing.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/text_data.h"

namespace ham {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int64_t>;

// tests/data/tokenizers, found from HAM_SOURCE_DIR or else from this file's own path.
std::string fixture(const std::string& name) {
  const char* source_dir = std::getenv("HAM_SOURCE_DIR");
  std::filesystem::path tests_dir = source_dir ? std::filesystem::path(source_dir) / "tests"
                                               : std::filesystem::path(__FILE__).parent_path().parent_path();
  return (tests_dir / "data" / "tokenizers" / name).string();
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// A scratch directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("ham_tok_" + std::to_string(getpid()) + "_" + info->name());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name, const std::string& contents) const {
    std::string p = (path_ / name).string();
    std::ofstream(p, std::ios::binary) << contents;
    return p;
  }

 private:
  std::filesystem::path path_;
};

using testing::error_of;

using testing::expect_one_line_naming;

// The GPT-2 pre-tokenizer needs ICU's Unicode classes; a build without them (-DHAM_ICU=OFF,
// as on the GPU machine, which has no Debian packages) fails it with a one-line error.
#define SKIP_UNLESS_UNICODE_CLASSES()                                                      \
  if (!has_unicode_classes())                                                              \
  GTEST_SKIP() << "this build has no ICU (configured with -DHAM_ICU=OFF): no Unicode classes"

std::string all_bytes() {
  std::string s;
  for (int b = 0; b < 256; ++b) s += char(b);
  return s;
}

// ---- Bytes --------------------------------------------------------------------------------

TEST(Tokenizer, BytesKeepsByteTokenizerIds) {
  RawBytesTokenizer tok;
  std::string text = "caf\xc3\xa9 \x01\xff";
  EXPECT_EQ(tok.encode(text), ByteTokenizer().encode(text));
  EXPECT_EQ(tok.encode("A\n"), (Ids{65, 10}));
  EXPECT_EQ(tok.vocab_size(), 257);
  EXPECT_EQ(tok.eot_id(), 256);
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.document_start_id(), 256);
  EXPECT_EQ(tok.name(), "bytes");
  EXPECT_EQ(tok.text_bytes(65), 1);
  EXPECT_EQ(tok.text_bytes(256), 0);  // the document start holds no text
  testing::expect_error([&] { tok.text_bytes(257); }, {"bytes tokenizer", "257"});
}

TEST(Tokenizer, BytesRoundTripsAnyUtf8AndInvalidBytes) {
  RawBytesTokenizer tok;
  std::mt19937 rng(7);
  std::vector<std::string> texts = {"", all_bytes(), "\xc3\x28 \xe2\x82 \xf0\x9f\x98\x80 \xed\xa0\x80 \xc0\xaf",
                                    "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80"};
  for (int i = 0; i < 20; ++i) {
    std::string s;
    for (int k = 0; k < 100; ++k) s += char(rng() & 0xFF);
    texts.push_back(s);
  }
  for (const auto& text : texts) {
    Ids ids = tok.encode(text);
    EXPECT_EQ(ids.size(), text.size());
    EXPECT_EQ(tok.decode(ids), text);
  }
}

TEST(Tokenizer, BytesSpecialTokenOnlyWhenAsked) {
  RawBytesTokenizer tok;
  EXPECT_EQ(tok.encode_with_special("a<|endoftext|>b"), (Ids{'a', 256, 'b'}));
  EXPECT_EQ(tok.encode("a<|endoftext|>b").size(), 15u);  // the marker as 13 bytes
  EXPECT_EQ(tok.encode_with_special("<|endoftext|"), tok.encode("<|endoftext|"));
  EXPECT_EQ(tok.decode({'a', 256}), "a<|endoftext|>");
  EXPECT_THROW(tok.decode({257}), Error);
  EXPECT_THROW(tok.decode({-1}), Error);
}

// ---- The GPT-2 pre-tokenizer ------------------------------------------------------------

using Pieces = std::vector<std::string_view>;

TEST(Tokenizer, Gpt2PretokensFollowThePattern) {
  SKIP_UNLESS_UNICODE_CLASSES();
  EXPECT_EQ(split_gpt2_pretokens("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(split_gpt2_pretokens("I'm here, they'll go"),
            (Pieces{"I", "'m", " here", ",", " they", "'ll", " go"}));
  // Contractions are lowercase only; a space joins a following apostrophe as punctuation.
  EXPECT_EQ(split_gpt2_pretokens("don't DON'T 's"), (Pieces{"don", "'t", " DON", "'", "T", " '", "s"}));
  // White space: a run gives up its last character to the word that follows.
  EXPECT_EQ(split_gpt2_pretokens("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(split_gpt2_pretokens("x \n y"), (Pieces{"x", " \n", " y"}));
  EXPECT_EQ(split_gpt2_pretokens("end   "), (Pieces{"end", "   "}));
  EXPECT_EQ(split_gpt2_pretokens("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(split_gpt2_pretokens("3.14 cats!!"), (Pieces{"3", ".", "14", " cats", "!!"}));
  EXPECT_TRUE(split_gpt2_pretokens("").empty());
}

TEST(Tokenizer, Gpt2PretokensUseUnicodeClasses) {
  SKIP_UNLESS_UNICODE_CLASSES();
  // Letters beyond ASCII (é, ß, CJK), numbers beyond ASCII (Arabic-Indic digits, the
  // superscript two, the Roman numeral eight), emoji as symbols, combining marks apart.
  EXPECT_EQ(split_gpt2_pretokens("caf\xc3\xa9 \xc3\x9f \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"),
            (Pieces{"caf\xc3\xa9", " \xc3\x9f", " \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"}));
  EXPECT_EQ(split_gpt2_pretokens("x \xd9\xa3\xd9\xa4"), (Pieces{"x", " \xd9\xa3\xd9\xa4"}));
  EXPECT_EQ(split_gpt2_pretokens("x\xc2\xb2 \xe2\x85\xb7"), (Pieces{"x", "\xc2\xb2", " \xe2\x85\xb7"}));
  EXPECT_EQ(split_gpt2_pretokens("hi \xf0\x9f\x98\x80\xf0\x9f\x98\x80!"),
            (Pieces{"hi", " \xf0\x9f\x98\x80\xf0\x9f\x98\x80!"}));
  EXPECT_EQ(split_gpt2_pretokens("e\xcc\x81"), (Pieces{"e", "\xcc\x81"}));
  // No-break space and ideographic space are white space, but only ' ' joins a word.
  EXPECT_EQ(split_gpt2_pretokens("a\xc2\xa0" "b"), (Pieces{"a", "\xc2\xa0", "b"}));
  EXPECT_EQ(split_gpt2_pretokens("a\xe3\x80\x80\xe3\x80\x80" "b"),
            (Pieces{"a", "\xe3\x80\x80", "\xe3\x80\x80", "b"}));
  // Bytes that are not UTF-8 count as symbols; the pieces still cover the text.
  EXPECT_EQ(split_gpt2_pretokens("ab\xff\xfe" "cd"), (Pieces{"ab", "\xff\xfe", "cd"}));
  std::string bytes = all_bytes();
  std::string joined;
  for (auto piece : split_gpt2_pretokens(bytes)) joined += piece;
  EXPECT_EQ(joined, bytes);
}

// ---- Byte-level BPE (tests/data/tokenizers/byte_level_bpe.json) --------------------------
//
// Ids 0..255 are GPT-2's byte characters: printable bytes 33..126 are ids 0..93 (so 'a' is
// 64), then 161..172 (94..105), 174..255 (106..187), then the other bytes in order from
// 188 (' ' -> "Ġ" 220, '\n' -> "Ċ" 198). Merges, by rank, with their ids:
//   0 Ġ t->256  1 h e->257  2 Ġt he->258  3 i n->259  4 Ġ c->260  5 a t->261  6 Ġc at->262
//   7 l l->263  8 e ll->264  9 h ell->265  10 hell o->266  11 Ã ©->267  12 c a->268
//   13 f Ã©->269  14 ca fÃ©->270  15 1 2->271  16 Ġ Ġ->272;  <|endoftext|> is 273.

class TokenizerByteLevelBpe : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_UNLESS_UNICODE_CLASSES(); }
  BpeTokenizer tok = BpeTokenizer::from_tokenizer_json(fixture("byte_level_bpe.json"));
};

TEST_F(TokenizerByteLevelBpe, KnownEncodings) {
  EXPECT_EQ(tok.style(), BpeTokenizer::Style::kByteLevel);
  // "h e" outranks "l l" and "e ll", so "hell" never forms: he + ll + o.
  EXPECT_EQ(tok.encode("hello"), (Ids{257, 263, 78}));
  // "the" has no leading space, so "Ġ t" cannot apply: t + he.
  EXPECT_EQ(tok.encode("the cat"), (Ids{83, 257, 262}));
  EXPECT_EQ(tok.encode(" the cat"), (Ids{258, 262}));
  // é is bytes C3 A9 = characters Ã ©: c a f Ã © -> c a f Ã© -> ca f Ã© -> ca fÃ© -> cafÃ©.
  EXPECT_EQ(tok.encode("caf\xc3\xa9"), (Ids{270}));
  EXPECT_EQ(tok.encode("12 cats!"), (Ids{271, 262, 82, 0}));
  EXPECT_EQ(tok.encode("a   b"), (Ids{64, 272, 220, 65}));
  // 日本 = E6 97 A5 E6 9C AC: byte ids 162 245 98 162 250 105, no merges.
  EXPECT_EQ(tok.encode("\xe6\x97\xa5\xe6\x9c\xac"), (Ids{162, 245, 98, 162, 250, 105}));
  EXPECT_TRUE(tok.encode("").empty());
}

TEST_F(TokenizerByteLevelBpe, DecodesAndRoundTripsAnyBytes) {
  EXPECT_EQ(tok.decode({258, 262}), " the cat");
  EXPECT_EQ(tok.decode({270, 198}), "caf\xc3\xa9\n");
  EXPECT_EQ(tok.decode({273}), "<|endoftext|>");
  std::mt19937 rng(3);
  std::vector<std::string> texts = {all_bytes(), "\xc3\x28\xff the cat\r\n\t caf\xc3\xa9 12!",
                                    "  leading and trailing  ", "\xf0\x9f\x98\x80 emoji"};
  for (int i = 0; i < 20; ++i) {
    std::string s;
    for (int k = 0; k < 200; ++k) s += "ab c\xc3\xa9\n'1\xff"[rng() % 11];
    texts.push_back(s);
  }
  for (const auto& text : texts) EXPECT_EQ(tok.decode(tok.encode(text)), text);
  EXPECT_THROW(tok.decode({274}), Error);
}

TEST_F(TokenizerByteLevelBpe, SpecialTokensOnlyWhenAsked) {
  EXPECT_EQ(tok.encode_with_special("the<|endoftext|>cat"), (Ids{83, 257, 273, 66, 261}));
  // As text the marker is < | endoftext | > in bytes: "<|", letters, "|>".
  EXPECT_EQ(tok.encode("<|endoftext|>"), (Ids{27, 91, 68, 77, 67, 78, 69, 83, 68, 87, 83, 91, 29}));
  EXPECT_EQ(tok.decode(tok.encode_with_special("a<|endoftext|>b")), "a<|endoftext|>b");
  EXPECT_EQ(tok.vocab_size(), 274);
  EXPECT_EQ(tok.eot_id(), 273);
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.document_start_id(), 273);
  EXPECT_EQ(tok.token_id("\xc4\xa0the"), 258);  // "Ġthe"
  EXPECT_EQ(tok.token_id("nope"), -1);
  EXPECT_EQ(tok.piece(262), "\xc4\xa0" "cat");
}

TEST_F(TokenizerByteLevelBpe, IsSafeToShareAcrossThreads) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += " the cat said hello " + std::to_string(i);
  Ids expected = tok.encode(text);
  std::vector<Ids> results(4);
#pragma omp parallel for num_threads(4)
  for (int t = 0; t < 4; ++t) results[size_t(t)] = tok.encode(text);
  for (const auto& r : results) EXPECT_EQ(r, expected);
}

// ---- Merge order on long words (the heap path) against a direct reference ----------------

// The textbook loop: merge the lowest-ranked adjacent pair (leftmost among equals) until
// none applies.
Ids reference_bpe(std::vector<std::string> symbols, const std::vector<std::pair<std::string, std::string>>& merges,
                  const std::map<std::string, int64_t>& vocab) {
  while (true) {
    size_t best_rank = SIZE_MAX, best_at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      for (size_t r = 0; r < merges.size() && r < best_rank; ++r) {
        if (merges[r].first == symbols[i] && merges[r].second == symbols[i + 1]) {
          best_rank = r;
          best_at = i;
        }
      }
    }
    if (best_rank == SIZE_MAX) break;
    symbols[best_at] += symbols[best_at + 1];
    symbols.erase(symbols.begin() + std::ptrdiff_t(best_at) + 1);
  }
  Ids ids;
  for (const auto& s : symbols) ids.push_back(vocab.at(s));
  return ids;
}

TEST(Tokenizer, MergeOrderMatchesTheReferenceOnShortAndLongWords) {
  SKIP_UNLESS_UNICODE_CLASSES();
  std::vector<std::pair<std::string, std::string>> merges = {
      {"a", "b"}, {"b", "a"}, {"a", "a"}, {"ab", "a"}, {"b", "b"}, {"aa", "aa"}, {"ab", "ab"},
      {"ba", "b"}, {"aba", "b"}, {"bb", "a"}, {"abab", "ab"}, {"aaaa", "a"}};
  std::map<std::string, int64_t> vocab = {{"a", 0}, {"b", 1}};
  json doc = {{"model", {{"type", "BPE"}, {"vocab", json::object()}, {"merges", json::array()}}},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}}};
  for (const auto& [a, b] : merges) {
    if (!vocab.count(a + b)) vocab[a + b] = int64_t(vocab.size());
    doc["model"]["merges"].push_back(a + " " + b);
  }
  for (const auto& [piece, id] : vocab) doc["model"]["vocab"][piece] = id;
  BpeTokenizer tok = BpeTokenizer::from_json(doc, "inline");
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    size_t length = 1 + rng() % 300;  // one letter run: one word, short or long
    std::string word;
    std::vector<std::string> symbols;
    for (size_t i = 0; i < length; ++i) {
      char c = (rng() % 3 == 0) ? 'b' : 'a';
      word += c;
      symbols.push_back(std::string(1, c));
    }
    ASSERT_EQ(tok.encode(word), reference_bpe(symbols, merges, vocab)) << word;
  }
  // By hand: 65 a's pair up left to right (32 "aa" and an "a"), then 16 "aaaa" and the
  // "aaaa a" merge joins the last "aaaa" with the lone "a".
  Ids expected(15, vocab.at("aaaa"));
  expected.push_back(vocab.at("aaaaa"));
  EXPECT_EQ(tok.encode(std::string(65, 'a')), expected);
}

// ---- Sentencepiece-style BPE (tests/data/tokenizers/sentencepiece_bpe.json) -------------
//
// <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258, ▁ 259, t 260, h 261, e 262, c 263,
// a 264, s 265, l 266, o 267; merges by rank: 0 ▁ t->268  1 h e->269  2 ▁t he->270
// 3 a t->271  4 ▁ c->272  5 ▁c at->273  6 l l->274  7 ▁ ▁->275.
// The normalizer prepends ▁ and turns spaces into ▁ (Llama-2).

class TokenizerSentencePiece : public ::testing::Test {
 protected:
  BpeTokenizer tok = BpeTokenizer::from_tokenizer_json(fixture("sentencepiece_bpe.json"));
};

TEST_F(TokenizerSentencePiece, KnownEncodings) {
  EXPECT_EQ(tok.style(), BpeTokenizer::Style::kSentencePiece);
  // ▁the▁cat: ▁ t h e -> ▁t h e -> ▁t he -> ▁the; ▁ c a t -> ▁ c at -> ▁c at -> ▁cat.
  EXPECT_EQ(tok.encode("the cat"), (Ids{270, 273}));
  EXPECT_EQ(tok.encode("hello"), (Ids{259, 269, 274, 267}));
  // f and é are not pieces: f -> <0x66> (105), é -> <0xC3> <0xA9> (198, 172).
  EXPECT_EQ(tok.encode("caf\xc3\xa9"), (Ids{272, 264, 105, 198, 172}));
  // ▁a▁▁b: the two ▁ merge; b -> <0x62> (101).
  EXPECT_EQ(tok.encode("a  b"), (Ids{259, 264, 275, 101}));
  EXPECT_EQ(tok.encode("a\nb"), (Ids{259, 264, 13, 101}));
  EXPECT_EQ(tok.encode("\xff"), (Ids{259, 258}));
  EXPECT_TRUE(tok.encode("").empty());
}

TEST_F(TokenizerSentencePiece, DecodeUndoesTheSpaceMarks) {
  EXPECT_EQ(tok.decode({270, 273}), "the cat");
  EXPECT_EQ(tok.decode({259, 264, 275, 101}), "a  b");
  EXPECT_EQ(tok.decode({272, 264, 105, 198, 172}), "caf\xc3\xa9");
  std::vector<std::string> texts = {"the cat sat", " leading space", "trailing  ", "a\n\n b\tc",
                                    all_bytes().substr(1), "\xc3\x28 invalid \xff\xfe",
                                    "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80"};
  for (const auto& text : texts) EXPECT_EQ(tok.decode(tok.encode(text)), text);
  // Text bytes count the marker the encoder prepends as its space; <s> and </s> hold none.
  int64_t bytes = 0;
  for (int64_t id : tok.encode_with_special("<s>the cat</s>")) bytes += tok.text_bytes(id);
  EXPECT_EQ(bytes, int64_t(std::string(" the cat").size()));
}

// `ham generate` prints a continuation as it grows: decoding one more token may only add
// text at the end (the first piece's stripped space included), never change what was there.
TEST_F(TokenizerSentencePiece, DecodingOneMoreTokenOnlyAppends) {
  const Ids ids = tok.encode_with_special("<s>the cat</s> a  b caf\xc3\xa9\n\xff<s> the");
  ASSERT_GT(ids.size(), 10u);
  std::string before;
  for (size_t n = 1; n <= ids.size(); ++n) {
    const std::string text = tok.decode(Ids(ids.begin(), ids.begin() + std::ptrdiff_t(n)));
    EXPECT_EQ(text.substr(0, before.size()), before) << "after " << n << " tokens";
    before = text;
  }
  EXPECT_EQ(before, "<s>the cat</s> a  b caf\xc3\xa9\n\xff<s> the");
}

TEST_F(TokenizerSentencePiece, SpecialTokensAndDocumentStart) {
  // Each text segment gets its own leading ▁, and decoding drops it again.
  EXPECT_EQ(tok.encode_with_special("<s>the cat</s>"), (Ids{1, 270, 273, 2}));
  EXPECT_EQ(tok.decode({1, 270, 273, 2}), "<s>the cat</s>");
  EXPECT_EQ(tok.decode(tok.encode_with_special("<s> a</s>b")), "<s> a</s>b");
  // As text: ▁ < s > with < and > as bytes 0x3C, 0x3E.
  EXPECT_EQ(tok.encode("<s>"), (Ids{259, 63, 265, 65}));
  EXPECT_EQ(tok.vocab_size(), 276);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eot_id(), 2);
  EXPECT_EQ(tok.document_start_id(), 1);
}

TEST_F(TokenizerSentencePiece, UnknownCharactersFuseIntoOneUnkWithoutByteFallback) {
  json doc = read_json(fixture("sentencepiece_bpe.json"));
  doc["model"]["byte_fallback"] = false;
  BpeTokenizer no_fallback = BpeTokenizer::from_json(doc, "inline");
  EXPECT_EQ(no_fallback.encode("\xe6\x97\xa5\xe6\x9c\xac"), (Ids{259, 0}));
  EXPECT_EQ(no_fallback.encode("the cat"), (Ids{270, 273}));
  doc["model"]["unk_token"] = nullptr;
  BpeTokenizer no_unk = BpeTokenizer::from_json(doc, "inline");
  expect_one_line_naming(error_of([&] { no_unk.encode("x"); }), {"inline", "U+0078", "unk_token"});
}

TEST(Tokenizer, MetaspacePreTokenizerMarksSpacesToo) {
  // Newer Llama files: no normalizer, a Metaspace pre-tokenizer that prepends ▁ to the
  // first segment and splits before each ▁.
  json doc = read_json(fixture("sentencepiece_bpe.json"));
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xe2\x96\x81"},
                          {"prepend_scheme", "first"}, {"split", true}};
  BpeTokenizer tok = BpeTokenizer::from_json(doc, "inline");
  EXPECT_EQ(tok.encode("the cat"), (Ids{270, 273}));
  // Split before each ▁, so "▁▁" cannot form: ▁a | ▁ | ▁b.
  EXPECT_EQ(tok.encode("a  b"), (Ids{259, 264, 259, 259, 101}));
  EXPECT_EQ(tok.decode(tok.encode("the cat")), "the cat");
}

// ---- Loading ----------------------------------------------------------------------------

TEST(Tokenizer, LoadTokenizerPicksBytesOrAFile) {
  EXPECT_EQ(load_tokenizer("bytes")->name(), "bytes");
  auto tok = load_tokenizer(fixture("byte_level_bpe.json"));
  EXPECT_EQ(tok->vocab_size(), 274);
  EXPECT_NE(tok->name().find("byte_level_bpe.json"), std::string::npos);
}

TEST(Tokenizer, MalformedFilesNameTheFileAndTheField) {
  TempDir dir;
  const json good = read_json(fixture("byte_level_bpe.json"));
  auto message_for = [&](const std::string& name, const json& doc) {
    std::string path = dir.file(name, doc.dump());
    return std::pair{path, error_of([&] { BpeTokenizer::from_tokenizer_json(path); })};
  };
  {
    json doc = good;
    doc.erase("model");
    auto [path, message] = message_for("no_model.json", doc);
    expect_one_line_naming(message, {path, "'model' is missing"});
  }
  {
    json doc = good;
    doc["model"].erase("vocab");
    auto [path, message] = message_for("no_vocab.json", doc);
    expect_one_line_naming(message, {path, "'model.vocab' is missing"});
  }
  {
    json doc = good;
    doc["model"].erase("merges");
    auto [path, message] = message_for("no_merges.json", doc);
    expect_one_line_naming(message, {path, "'model.merges' is missing"});
  }
  {
    json doc = good;
    doc["model"]["type"] = "WordPiece";
    auto [path, message] = message_for("wordpiece.json", doc);
    expect_one_line_naming(message, {path, "'model.type'", "WordPiece", "BPE"});
  }
  {
    json doc = good;
    doc["model"].erase("type");
    auto [path, message] = message_for("no_type.json", doc);
    expect_one_line_naming(message, {path, "'model.type' is missing"});
  }
  {
    json doc = good;
    doc["model"]["merges"][2] = "\xc4\xa0t zz";  // "Ġt zz": zz is not a piece
    auto [path, message] = message_for("unknown_piece.json", doc);
    expect_one_line_naming(message, {path, "'model.merges[2]'", "'zz'", "not in model.vocab"});
  }
  {
    json doc = good;
    doc["model"]["merges"][0] = "nospace";
    auto [path, message] = message_for("one_piece.json", doc);
    expect_one_line_naming(message, {path, "'model.merges[0]'", "two pieces"});
  }
  {
    json doc = good;
    doc["model"]["merges"][1] = json::array({1, 2});
    auto [path, message] = message_for("numbers.json", doc);
    expect_one_line_naming(message, {path, "'model.merges[1]'"});
  }
  {
    json doc = good;
    doc["model"]["vocab"]["x"] = -3;
    auto [path, message] = message_for("negative_id.json", doc);
    expect_one_line_naming(message, {path, "'model.vocab'", "'x'"});
  }
  {
    json doc = good;
    doc["pre_tokenizer"] = {{"type", "Whitespace"}};
    auto [path, message] = message_for("whitespace.json", doc);
    expect_one_line_naming(message, {path, "'pre_tokenizer.type'", "Whitespace"});
  }
  {
    json doc = read_json(fixture("sentencepiece_bpe.json"));
    doc["model"]["vocab"].erase("<0x41>");
    auto [path, message] = message_for("no_byte.json", doc);
    expect_one_line_naming(message, {path, "'model.byte_fallback'", "<0x41>"});
  }
  {
    std::string path = dir.file("broken.json", "{\"model\": {\"type\": \"BPE\",\n \"vocab\": ");
    expect_one_line_naming(error_of([&] { BpeTokenizer::from_tokenizer_json(path); }),
                           {path, "not valid JSON"});
  }
  expect_one_line_naming(error_of([] { BpeTokenizer::from_tokenizer_json("/no/such/tokenizer.json"); }),
                         {"/no/such/tokenizer.json", "cannot read the tokenizer file", "No such file"});
}

}  // namespace
}  // namespace ham
