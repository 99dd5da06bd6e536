#include "train/training_data.h"

#include <gtest/gtest.h>

#include "tests/error_testing.h"

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

}  // namespace
}  // namespace ham
