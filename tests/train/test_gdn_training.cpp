// GDN and GDN-GSA learn on the embedded corpus: configs/tiny/{gdn,gdn-gsa}.json trained
// for 30 steps lower the training loss by more than 20%.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>

#include "models/gdn.h"
#include "train/trainer.h"

namespace ham {
namespace {

// The source tree (the build defines HAM_SOURCE_DIR; else three levels up from here).
std::filesystem::path source_dir() {
#ifdef HAM_SOURCE_DIR
  return HAM_SOURCE_DIR;
#else
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
#endif
}

ModelConfig tiny_config(const std::string& file) {
  return ModelConfig::from_file((source_dir() / "configs" / "tiny" / file).string());
}

void expect_loss_falls(LanguageModel& model) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  TrainOptions opt;
  opt.steps = 30;
  opt.batch_size = 4;
  opt.seq_len = 32;
  opt.warmup_steps = 5;
  opt.log_every = 10;  // final_loss: mean over steps 21..30
  opt.eval_every = 30;
  opt.eval_batches = 2;
  std::ostringstream log;
  TrainResult r = train(model, train_data, val_data, opt, log);
  EXPECT_NEAR(r.first_loss, std::log(257.0), 0.3) << log.str();
  EXPECT_LT(r.final_loss, 0.8 * r.first_loss) << log.str();
  EXPECT_LT(r.final_val_loss, r.initial_val_loss) << log.str();
  std::cout << family_name(model.config().family) << ": first loss " << r.first_loss
            << ", final loss " << r.final_loss << ", val " << r.initial_val_loss << " -> "
            << r.final_val_loss << "\n";
}

TEST(GDNTraining, TinyGDNLossFallsOnTheEmbeddedCorpus) {
  ModelConfig c = tiny_config("gdn.json");
  ASSERT_EQ(c.family, ModelFamily::GDN);
  GDNModel model(c);
  expect_loss_falls(model);
}

TEST(GDNTraining, TinyGDNGSALossFallsOnTheEmbeddedCorpus) {
  ModelConfig c = tiny_config("gdn-gsa.json");
  ASSERT_EQ(c.family, ModelFamily::GDNGSA);
  ASSERT_TRUE(c.is_attention_layer(1) && c.is_attention_layer(3) && !c.is_attention_layer(0));
  GDNGSAModel model(c);
  expect_loss_falls(model);
}

}  // namespace
}  // namespace ham
