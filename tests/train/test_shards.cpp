#include "train/shards.h"
#include "tests/error_testing.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "train/tokenizer.h"

namespace ham {
namespace {

using Ids = std::vector<int64_t>;

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("ham_shards_" + std::to_string(getpid()) + "_" + info->name());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path(const std::string& name) const { return (path_ / name).string(); }
  std::string file(const std::string& name, const std::string& contents) const {
    std::ofstream(path(name), std::ios::binary) << contents;
    return path(name);
  }

 private:
  std::filesystem::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int32_t header_int(const std::string& bytes, int index) {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * index, 4);
  return v;
}

// An llm.c header by hand: 256 little-endian int32 with magic, version and count.
std::string header(int32_t magic, int32_t version, int32_t count) {
  std::string h(1024, '\0');
  std::memcpy(&h[0], &magic, 4);
  std::memcpy(&h[4], &version, 4);
  std::memcpy(&h[8], &count, 4);
  return h;
}

std::string uint16_tokens(const Ids& ids) {
  std::string s;
  for (int64_t id : ids) {
    s += char(id & 0xFF);
    s += char((id >> 8) & 0xFF);
  }
  return s;
}

using testing::error_of;

using testing::expect_one_line_naming;

TEST(Shards, Uint16RoundTripWithTheLlmcLayout) {
  TempDir dir;
  Ids tokens = {50256, 15496, 995, 0, 65535};
  std::string path = dir.path("a.bin");
  write_shard(path, tokens, 2);
  std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  EXPECT_EQ(header_int(bytes, 0), 20240520);
  EXPECT_EQ(header_int(bytes, 1), 1);
  EXPECT_EQ(header_int(bytes, 2), 5);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header_int(bytes, i), 0);
  // 50256 = 0xC450, little-endian.
  EXPECT_EQ(uint8_t(bytes[1024]), 0x50);
  EXPECT_EQ(uint8_t(bytes[1025]), 0xC4);
  EXPECT_EQ(load_shard(path), tokens);
  Shard shard = Shard::open(path, 65536);
  EXPECT_EQ(shard.size(), 5);
  EXPECT_EQ(shard.token_width(), 2);
  EXPECT_EQ(shard[1], 15496);
}

TEST(Shards, Uint32RoundTrip) {
  TempDir dir;
  Ids tokens = {128000, 70000, 1, 4294967295LL};
  std::string path = dir.path("b.bin");
  write_shard(path, tokens, 4);
  std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 4 * tokens.size());
  EXPECT_EQ(header_int(bytes, 0), 20240801);
  EXPECT_EQ(header_int(bytes, 1), 7);
  EXPECT_EQ(header_int(bytes, 2), 4);
  EXPECT_EQ(load_shard(path), tokens);
  EXPECT_EQ(Shard::open(path).token_width(), 4);
  // An empty shard is just the header.
  write_shard(dir.path("empty.bin"), {}, 4);
  EXPECT_TRUE(load_shard(dir.path("empty.bin")).empty());
}

TEST(Shards, WidthFollowsTheVocabulary) {
  EXPECT_EQ(shard_token_width(257), 2);
  EXPECT_EQ(shard_token_width(50257), 2);
  EXPECT_EQ(shard_token_width(65536), 2);
  EXPECT_EQ(shard_token_width(65537), 4);
  EXPECT_EQ(shard_token_width(128256), 4);
  TempDir dir;
  expect_one_line_naming(error_of([&] { write_shard(dir.path("w.bin"), {1, 70000}, 2); }),
                         {"w.bin", "70000", "position 1", "16-bit"});
}

TEST(Shards, ReaderRejectsBadFilesInOneLineNamingTheFile) {
  TempDir dir;
  Ids tokens = {256, 104, 105, 256, 33};
  std::string good = header(20240520, 1, 5) + uint16_tokens(tokens);
  {
    std::string path = dir.file("truncated.bin", good.substr(0, good.size() - 1));
    expect_one_line_naming(error_of([&] { load_shard(path); }), {path, "truncated", "5 tokens", "1033 bytes"});
  }
  {
    std::string path = dir.file("trailing.bin", good + "xyz");
    expect_one_line_naming(error_of([&] { load_shard(path); }), {path, "3 trailing bytes"});
  }
  {
    std::string path = dir.file("magic.bin", header(12345, 1, 5) + uint16_tokens(tokens));
    expect_one_line_naming(error_of([&] { load_shard(path); }), {path, "magic is 12345", "20240520", "20240801"});
  }
  {
    std::string path = dir.file("version.bin", header(20240520, 7, 5) + uint16_tokens(tokens));
    expect_one_line_naming(error_of([&] { load_shard(path); }), {path, "version is 7", "version 1"});
  }
  {
    std::string path = dir.file("version32.bin", header(20240801, 1, 0));
    expect_one_line_naming(error_of([&] { load_shard(path); }), {path, "version is 1", "version 7"});
  }
  {
    std::string path = dir.file("short.bin", std::string(100, '\0'));
    expect_one_line_naming(error_of([&] { load_shard(path); }), {path, "100 bytes", "1024-byte header"});
  }
  {
    // Checked against the model's vocabulary: the first offending position and id.
    std::string path = dir.file("vocab.bin", good);
    EXPECT_EQ(load_shard(path, 257), tokens);
    expect_one_line_naming(error_of([&] { load_shard(path, 256); }),
                           {path, "token 256 at position 0", "vocabulary of 256"});
    expect_one_line_naming(error_of([&] { load_shard(path, 105); }),
                           {path, "token 256 at position 0"});
    std::string later = dir.file("later.bin", header(20240520, 1, 3) + uint16_tokens({1, 2, 900}));
    expect_one_line_naming(error_of([&] { load_shard(later, 800); }),
                           {later, "token 900 at position 2", "vocabulary of 800"});
  }
  expect_one_line_naming(error_of([&] { load_shard(dir.path("missing.bin")); }), {"missing.bin", "cannot open"});
}

TEST(Shards, DatasetReadsShardsAsOneStream) {
  TempDir dir;
  constexpr int64_t kEot = 9;
  // Documents: [9 1 2 3] [9 4 5 | 6 7] [9 8]: the second one continues into shard 1.
  write_shard(dir.path("d_train_000000.bin"), {kEot, 1, 2, 3, kEot, 4, 5}, 2);
  write_shard(dir.path("d_train_000001.bin"), {6, 7, kEot, 8}, 2);
  write_shard(dir.path("d_val_000000.bin"), {kEot, 3, 3}, 2);
  ShardDataset data({dir.path("d_train_*.bin")}, 10, kEot);
  ASSERT_EQ(data.shards().size(), 2u);
  EXPECT_EQ(data.size(), 11);
  EXPECT_EQ(data.tokens(), (Ids{kEot, 1, 2, 3, kEot, 4, 5, 6, 7, kEot, 8}));
  EXPECT_EQ(data.tokens(5, 4), (Ids{4, 5, 6, 7}));

  TokenBatch b = data.batch_at({3, 0}, 7);
  EXPECT_EQ(b.inputs.to_vector<int64_t>(), (Ids{3, kEot, 4, 5, 6, 7, kEot, kEot, 1, 2, 3, kEot, 4, 5}));
  EXPECT_EQ(b.targets.to_vector<int64_t>(), (Ids{kEot, 4, 5, 6, 7, kEot, 8, 1, 2, 3, kEot, 4, 5, 6}));
  EXPECT_EQ(b.doc_ids.to_vector<int64_t>(), (Ids{0, 1, 1, 1, 1, 1, 2, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(b.positions.to_vector<int64_t>(), (Ids{0, 0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 0, 1, 2}));
  EXPECT_THROW(data.batch_at({4}, 7), Error);

  Generator g1(3), g2(3);
  EXPECT_EQ(data.sample(4, 5, g1).inputs.to_vector<int64_t>(), data.sample(4, 5, g2).inputs.to_vector<int64_t>());
  auto windows = data.sequential(2, 3, 10);
  ASSERT_EQ(windows.size(), 2u);  // starts 0, 3, 6 in batches of two
  EXPECT_EQ(windows[1].inputs.to_vector<int64_t>(), (Ids{5, 6, 7}));

  // Lists of files, and patterns that match nothing or bad tokens.
  ShardDataset listed({dir.path("d_val_000000.bin"), dir.path("d_train_000001.bin")}, 0, kEot);
  EXPECT_EQ(listed.tokens(), (Ids{kEot, 3, 3, 6, 7, kEot, 8}));
  expect_one_line_naming(error_of([&] { ShardDataset({dir.path("x_*.bin")}, 10, kEot); }),
                         {"x_*.bin", "no shard files match"});
  expect_one_line_naming(error_of([&] { ShardDataset({dir.path("d_*.bin")}, 9, kEot); }),
                         {"d_train_000000.bin", "token 9 at position 0"});
}

TEST(Shards, TokenizeWritesDocumentsWithAStartTokenAndAValidationSplit) {
  TempDir dir;
  std::string a = dir.file("a.txt", "ab\n<|endoftext|>\ncd\n");
  std::string b = dir.file("b.txt", "ef");
  RawBytesTokenizer bytes;
  TokenizeOptions options;
  options.shard_tokens = 4;
  options.validation_fraction = 0.34;  // one of three documents
  TokenizeSummary s = tokenize_to_shards(bytes, {a, b}, dir.path("out"), options);
  EXPECT_EQ(s.token_width, 2);
  EXPECT_EQ(s.train_documents, 2);
  EXPECT_EQ(s.val_documents, 1);
  // train: [256 a b \n] [256 c d \n]; val: [256 e f]
  EXPECT_EQ(s.train_tokens, 8);
  EXPECT_EQ(s.val_tokens, 3);
  ASSERT_EQ(s.train_shards.size(), 2u);
  ASSERT_EQ(s.val_shards.size(), 1u);
  EXPECT_EQ(s.train_shards[0], dir.path("out_train_000000.bin"));
  EXPECT_EQ(s.val_shards[0], dir.path("out_val_000000.bin"));
  EXPECT_EQ(load_shard(s.train_shards[0]), (Ids{256, 'a', 'b', '\n'}));
  EXPECT_EQ(load_shard(s.train_shards[1]), (Ids{256, 'c', 'd', '\n'}));
  EXPECT_EQ(load_shard(s.val_shards[0], 257), (Ids{256, 'e', 'f'}));

  // One document per file keeps the marker as text; shards then cut a document.
  options.one_document_per_file = true;
  options.validation_fraction = 0;
  options.shard_tokens = 100;
  TokenizeSummary whole = tokenize_to_shards(bytes, {a, b}, dir.path("whole"), options);
  EXPECT_EQ(whole.train_documents, 2);
  EXPECT_EQ(whole.val_documents, 0);
  Ids tokens = load_shard(whole.train_shards.at(0));
  EXPECT_EQ(tokens.size(), 1 + 20 + 1 + 2u);
  EXPECT_EQ(tokens.front(), 256);
  EXPECT_EQ(bytes.decode(tokens), "<|endoftext|>ab\n<|endoftext|>\ncd\n<|endoftext|>ef");
}

TEST(Shards, TokenizeWithABpeTokenizerUsesItsDocumentStart) {
  const char* source_dir = std::getenv("HAM_SOURCE_DIR");
  std::filesystem::path tests_dir = source_dir ? std::filesystem::path(source_dir) / "tests"
                                               : std::filesystem::path(__FILE__).parent_path().parent_path();
  auto tok = load_tokenizer((tests_dir / "data/tokenizers/sentencepiece_bpe.json").string());
  TempDir dir;
  std::string a = dir.file("a.txt", "the cat\n<|endoftext|>\nhello");
  TokenizeSummary s = tokenize_to_shards(*tok, {a}, dir.path("sp"), TokenizeOptions{});
  // <s> starts each document; "the cat\n" is ▁the ▁cat <0x0A>, "hello" ▁ he ll o.
  EXPECT_EQ(load_shard(s.train_shards.at(0), tok->vocab_size()), (Ids{1, 270, 273, 13, 1, 259, 269, 274, 267}));
}

}  // namespace
}  // namespace ham
