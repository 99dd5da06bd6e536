#include "train/training_data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/error_testing.h"
#include "train/tokenizer.h"

namespace ham {
namespace {

TEST(TrainingData, PassesOverDataCountTheTokensOfTheDataRows) {
  TrainOptions options;
  options.steps = 100;
  options.batch_size = 8;
  options.grad_accum = 2;
  options.seq_len = 64;
  EXPECT_DOUBLE_EQ(passes_over_data(options, 102400), 1.0);  // 100 x 16 x 64 tokens
  options.mix_mqar = 0.25;                                    // a quarter of the rows synthetic
  EXPECT_DOUBLE_EQ(passes_over_data(options, 102400), 0.75);
  options.mix_niah = 0.25;
  EXPECT_DOUBLE_EQ(passes_over_data(options, 1024), 50.0);
  EXPECT_EQ(data_use_summary(options, 1024), "1024 train tokens, each read about 50x in 100 steps");
  options.mix_mqar = 0.75;  // every row synthetic
  EXPECT_EQ(data_use_summary(options, 1024), "1024 train tokens, not read (every row synthetic)");
  testing::expect_error([&] { passes_over_data(options, 0); }, {"passes_over_data", "no tokens"});
}

// A text file is encoded by the run's tokenizer, each document opened by that tokenizer's
// document start (sentencepiece's <s> here), the last document held out; bytes by default.
TEST(TrainingData, TextIsEncodedByTheRunsTokenizer) {
  const std::string tokenizer_path = std::string(HAM_SOURCE_DIR) + "/tests/data/tokenizers/sentencepiece_bpe.json";
  const std::string text_path =
      (std::filesystem::temp_directory_path() / ("ham_text_" + std::to_string(::getpid()) + ".txt")).string();
  const std::vector<std::string> documents = {"the cat sat\n", "a  b\n", "the end\n"};
  std::ofstream(text_path) << documents[0] << "<|endoftext|>\n" << documents[1] << "<|endoftext|>\n" << documents[2];
  BpeTokenizer tokenizer = BpeTokenizer::from_tokenizer_json(tokenizer_path);
  TrainOptions options;
  options.data_path = text_path;
  options.tokenizer = tokenizer_path;
  ModelConfig config;
  config.vocab_size = tokenizer.vocab_size();
  TrainingData data = open_training_data(options, config);
  auto stream = [&](std::initializer_list<size_t> docs) {
    std::vector<int64_t> ids;
    for (size_t d : docs) {
      ids.push_back(tokenizer.bos_id());
      for (int64_t id : tokenizer.encode(documents[d])) ids.push_back(id);
    }
    return ids;
  };
  auto all_of = [](const TokenSource& source) {
    std::vector<int64_t> ids(size_t(source.size()));
    source.read(0, source.size(), ids.data());
    return ids;
  };
  EXPECT_EQ(all_of(*data.train), stream({0, 1}));
  EXPECT_EQ(all_of(*data.val), stream({2}));
  EXPECT_EQ(data.train->document_start_id(), tokenizer.bos_id());
  EXPECT_NE(data.description.find("sentencepiece_bpe.json"), std::string::npos) << data.description;

  config.vocab_size = 257;
  testing::expect_error([&] { open_training_data(options, config); },
                        {text_path, "'vocab_size' (257)", "sentencepiece_bpe.json"});
  options.tokenizer = "bytes";
  data = open_training_data(options, config);
  EXPECT_EQ(data.train->document_start_id(), 256);
  EXPECT_EQ(data.train->size(), int64_t(2 + documents[0].size() + documents[1].size()));
  std::filesystem::remove(text_path);
}

}  // namespace
}  // namespace ham
