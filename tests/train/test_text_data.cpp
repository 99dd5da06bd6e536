#include "train/text_data.h"

#include <string>

#include <gtest/gtest.h>

namespace ham {
namespace {

TEST(TextData, SplitDocumentsAtMarkerLines) {
  auto docs = split_documents("one\ntwo\n<|endoftext|>\nthree\n<|endoftext|>\n<|endoftext|>\n");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], "one\ntwo\n");
  EXPECT_EQ(docs[1], "three\n");
  // The marker inside a line is ordinary text.
  EXPECT_EQ(split_documents("a <|endoftext|> b").size(), 1u);
}

TEST(TextData, ByteTokenizerRoundTrip) {
  ByteTokenizer tok;
  std::string text = "caf\xc3\xa9 \x01\xff";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  EXPECT_THROW(tok.decode({300}), Error);
}

TEST(TextData, WindowsCarryDocumentIdsAndRestartingPositions) {
  auto [train, val] = TokenStream::from_text("ab\n<|endoftext|>\ncd\n", 0.0, "test");
  EXPECT_EQ(val.size(), 0);
  // stream: EOT a b \n EOT c d \n
  ASSERT_EQ(train.size(), 8);
  TokenBatch b = train.batch_at({1}, 6);
  EXPECT_EQ(b.inputs.to_vector<int64_t>(), (std::vector<int64_t>{'a', 'b', '\n', 256, 'c', 'd'}));
  EXPECT_EQ(b.targets.to_vector<int64_t>(), (std::vector<int64_t>{'b', '\n', 256, 'c', 'd', '\n'}));
  EXPECT_EQ(b.doc_ids.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(b.positions.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_THROW(train.batch_at({3}, 6), Error);
}

TEST(TextData, ValidationTakesTheLastDocuments) {
  std::string text;
  for (int i = 0; i < 20; ++i) text += "doc " + std::to_string(i) + "\n<|endoftext|>\n";
  auto [train, val] = TokenStream::from_text(text, 0.1, "test");
  ByteTokenizer tok;
  std::string val_text = tok.decode(val.tokens());
  EXPECT_NE(val_text.find("doc 19"), std::string::npos);
  EXPECT_EQ(tok.decode(train.tokens()).find("doc 19"), std::string::npos);
}

TEST(TextData, SamplingIsDeterministicPerSeed) {
  auto [train, val] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  Generator g1(5), g2(5), g3(6);
  auto a = train.sample(4, 32, g1).inputs.to_vector<int64_t>();
  auto b = train.sample(4, 32, g2).inputs.to_vector<int64_t>();
  auto c = train.sample(4, 32, g3).inputs.to_vector<int64_t>();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(TextData, EmbeddedCorpusIsSubstantial) {
  EXPECT_GT(default_corpus().size(), 100000u);
  EXPECT_GT(split_documents(default_corpus()).size(), 10u);
}

}  // namespace
}  // namespace ham
